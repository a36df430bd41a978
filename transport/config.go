package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/dpcluster/dpcluster/pki"
)

// ClientConfig configures the typed layer shared by every Link: the run,
// message size limits and the chunked-transfer recovery. The zero value is
// not valid; start from DefaultClientConfig.
type ClientConfig struct {
	// Run scopes all subjects; it must satisfy ValidRunName.
	Run string
	// Role and Name are the role (pki.RoleReplica, RoleNode or
	// RoleObserver) and the replica, node or observer ID of the client:
	// with a random nonce they make its client ID, ROLE.NAME.NONCE (see
	// ClientID), its address in the NACK and inbox subjects. Empty means
	// "anon". With a TLS client certificate, Connect sets both from the
	// certificate (pki.Identity), and refuses values that disagree with
	// it: the server's permissions for that certificate cover only its own
	// address.
	Role pki.Role
	Name string
	// MaxMessageBytes bounds one encoded message, sent or received.
	MaxMessageBytes int64
	// MaxReassemblyBytes bounds the bytes of all incomplete incoming
	// transfers together. It must be ≥ MaxMessageBytes.
	MaxReassemblyBytes int64
	// QueueLen is the number of decoded messages buffered per Subscription
	// ahead of its handler.
	QueueLen int
	// WindowBytes is how many chunk bytes a sender publishes before it
	// flushes the connection (waits for the server to have read them).
	WindowBytes int
	// NackAfter is how long a receiver waits without a new chunk before it
	// asks the sender to resend the missing chunks, and the minimum gap
	// between two NACKs of one transfer.
	NackAfter time.Duration
	// MaxNacks bounds the NACKs sent per transfer.
	MaxNacks int
	// TransferTimeout is how long after its first chunk an incomplete
	// transfer is dropped and its memory freed (reported as ErrIncomplete).
	TransferTimeout time.Duration
	// RetainFor is how long a sender keeps a chunked message for
	// retransmission. It should be ≥ TransferTimeout.
	RetainFor time.Duration
	// RetainBytes bounds the bytes a sender keeps for retransmission.
	RetainBytes int64
	// RetainPerSubject is how many chunked messages a sender keeps per
	// subject: a newer one on a subject evicts the oldest. The protocol
	// never needs an older one retransmitted: a node's contribution is
	// useless once its round closes, and the next round opens only after
	// that; a RoundStart or Params is superseded by the next, and a node
	// that lacks a version asks for it (NeedParams), which the leader
	// answers from its state machine. With the default, 1, what a client
	// retains is at most one message per subject it publishes on (a node:
	// one contribution; the leader: one RoundStart and one Params), a
	// small multiple of the model size whatever the run's length or step
	// rate. A message's buffer, once evicted and no longer being resent,
	// is kept for the next large message to encode into: at most two such
	// buffers, each at most RetainBytes, for at most RetainFor.
	RetainPerSubject int
	// OnError, if not nil, is called with every receive-side error: frames
	// that fail to decode (ErrUnknownVersion, ErrUnknownType, ErrTruncated,
	// ErrCorrupt, ErrTooLarge, ErrWrongRun) and transfers that time out
	// (ErrIncomplete). It is called from receive goroutines, possibly
	// concurrently, and must not block. Errors never contain message values.
	OnError func(error)
}

// DefaultClientConfig returns the defaults: messages up to 1 GiB, 2 GiB of
// reassembly, NACK after 200 ms of silence (up to 10 times), transfers
// dropped after 30 s, sent transfers kept 30 s and up to 1 GiB, at most one
// per subject.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		Run:                "default",
		MaxMessageBytes:    1 << 30,
		MaxReassemblyBytes: 2 << 30,
		QueueLen:           64,
		WindowBytes:        8 << 20,
		NackAfter:          200 * time.Millisecond,
		MaxNacks:           10,
		TransferTimeout:    30 * time.Second,
		RetainFor:          30 * time.Second,
		RetainBytes:        1 << 30,
		RetainPerSubject:   1,
	}
}

// Validate checks ranges and cross-field relations.
func (c ClientConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if !validToken(c.Run) {
		bad("Run %q must be 1-64 of [A-Za-z0-9_-]", c.Run)
	}
	if c.Role != "" && !c.Role.Valid() {
		bad("Role %q must be %s, %s or %s", c.Role, pki.RoleReplica, pki.RoleNode, pki.RoleObserver)
	}
	if c.Name != "" && !validToken(c.Name) {
		bad("Name %q must be 1-64 of [A-Za-z0-9_-]", c.Name)
	}
	if c.MaxMessageBytes <= 0 {
		bad("MaxMessageBytes %d must be > 0", c.MaxMessageBytes)
	}
	if c.MaxReassemblyBytes < c.MaxMessageBytes {
		bad("MaxReassemblyBytes %d must be ≥ MaxMessageBytes %d", c.MaxReassemblyBytes, c.MaxMessageBytes)
	}
	if c.QueueLen <= 0 {
		bad("QueueLen %d must be > 0", c.QueueLen)
	}
	if c.WindowBytes <= 0 {
		bad("WindowBytes %d must be > 0", c.WindowBytes)
	}
	if c.NackAfter <= 0 {
		bad("NackAfter %v must be > 0", c.NackAfter)
	}
	if c.MaxNacks < 0 {
		bad("MaxNacks %d must be ≥ 0", c.MaxNacks)
	}
	if c.TransferTimeout <= c.NackAfter {
		bad("TransferTimeout %v must be > NackAfter %v", c.TransferTimeout, c.NackAfter)
	}
	if c.RetainFor < c.TransferTimeout {
		bad("RetainFor %v must be ≥ TransferTimeout %v", c.RetainFor, c.TransferTimeout)
	}
	if c.RetainBytes < 0 {
		bad("RetainBytes %d must be ≥ 0", c.RetainBytes)
	}
	if c.RetainPerSubject < 1 {
		bad("RetainPerSubject %d must be ≥ 1", c.RetainPerSubject)
	}
	return errors.Join(errs...)
}

// Config configures Connect: the typed layer (ClientConfig), and either the
// NATS servers to dial (URLs and their security options) or, when URLs is
// empty, an embedded NATS server started in-process (Embedded).
type Config struct {
	ClientConfig

	// URLs of the NATS servers (nats:// or tls://). Empty means: start an
	// embedded server as configured by Embedded and connect to it.
	URLs []string

	// Embedded configures the in-process server used when URLs is empty.
	Embedded EmbeddedServerConfig

	// TLS secures the connection to URLs. With CertFile, the client
	// presents that certificate, which must name a dpcluster identity
	// (pki.Identity: it sets Role and Name), and accepts only a server
	// that presents a replica certificate chaining to CAFile for the host
	// it dials (or ServerName). With an embedded server leave it empty:
	// the in-process client presents Embedded.TLS's certificate.
	TLS TLSConfig
	// NKeySeedFile is a file holding an NKey user seed. At most one of
	// NKeySeedFile, CredentialsFile and Token may be set.
	NKeySeedFile string
	// CredentialsFile is a NATS .creds file (user JWT and seed).
	CredentialsFile string
	// Token is an authentication token.
	Token string

	// ConnectTimeout bounds the initial connection (further bounded by the
	// context passed to Connect).
	ConnectTimeout time.Duration
	// ReconnectWait is the first reconnect delay; each further attempt
	// doubles it up to MaxReconnectWait, plus up to 25% random jitter.
	ReconnectWait    time.Duration
	MaxReconnectWait time.Duration
	// PingInterval and MaxPingsOutstanding detect a server that stopped
	// answering without closing the connection (a hung or paused process):
	// after MaxPingsOutstanding unanswered pings PingInterval apart the
	// client reconnects to another server. NATS's own default (2 min) would
	// leave a node deaf for minutes.
	PingInterval        time.Duration
	MaxPingsOutstanding int
	// RetryConnect keeps retrying the initial connection, with the
	// reconnect backoff, while no server answers, until the context passed
	// to Connect ends (ConnectTimeout then bounds each attempt). Processes
	// that may start before their NATS servers (nodes, replicas dialing a
	// cluster) set it.
	RetryConnect bool
	// MaxReconnects is the number of reconnect attempts before the
	// connection is closed for good; negative means forever.
	MaxReconnects int
	// PendingBytes is each subscription's client-side buffer (nats.go
	// SetPendingLimits; the message-count limit is disabled). It must hold
	// at least one WindowBytes burst per sender; beyond it NATS drops
	// messages as a slow consumer, and chunk loss is recovered by NACK.
	PendingBytes int
}

// TLSConfig names the PEM files for TLS, as written by `coordinator certs
// init`: the run's CA certificate, and this process's certificate and
// key. CertFile and KeyFile go together.
type TLSConfig struct {
	CAFile   string
	CertFile string
	KeyFile  string
	// ServerName, for a client, overrides the host name it checks the
	// server's certificate against (default: the host of the URL it
	// dials).
	ServerName string
}

func (t TLSConfig) enabled() bool { return t.CAFile != "" || t.CertFile != "" || t.ServerName != "" }

// EmbeddedServerConfig configures a NATS server embedded in this process
// (StartServer); coordinator.ServerConfig, by contrast, configures the
// coordinator's round loop.
type EmbeddedServerConfig struct {
	// Logger receives the server's log (StartServer; Connect gives the
	// server its own logger): refused connections at warn level, rate
	// limited, the rest at debug level. Nil discards it.
	Logger *slog.Logger
	// Host and Port to listen on; Port -1 picks a free port.
	Host string
	Port int
	// MaxPayload is the largest message the server accepts (NATS default
	// 1 MiB; larger messages are chunked by the Client).
	MaxPayload int32
	// MaxPending is the server's per-client outbound buffer before it
	// disconnects the client as a slow consumer (NATS default 64 MiB).
	MaxPending int64
	// ReadyTimeout bounds the wait for the server to accept connections.
	ReadyTimeout time.Duration

	// ClusterPort, if not 0, makes the server a member of a NATS cluster
	// named ClusterName: it accepts routes on ClusterHost:ClusterPort (-1:
	// any free port) and dials Routes (nats-route://host:port, the other
	// members; listing itself is harmless). Messages published on any
	// member reach subscribers on every member, so each coordinator
	// replica can embed one member and no single process carries the bus.
	ClusterName string
	ClusterHost string
	ClusterPort int
	Routes      []string

	// ClientAdvertise and ClusterAdvertise, if set (host:port), are the
	// client and route addresses the server tells clients and the other
	// members to use instead of the ones it listens on: the address of a
	// proxy or NAT in front of it (the network soak puts fault-injecting
	// proxies there). Empty: the listen addresses.
	ClientAdvertise  string
	ClusterAdvertise string

	// TLS, with CAFile, CertFile and KeyFile all set, secures the server
	// (issue 12; see docs/SECURITY.md): clients and routes must present a
	// certificate issued by the CA, each client certificate is mapped to
	// a NATS user with the permissions of its role and ID for run Run
	// (Subjects.Permissions), and routes are accepted from and dialed to
	// replica certificates only. The server's own certificate must be a
	// replica certificate with the ServerAuth and ClientAuth usages,
	// valid for the host names clients dial. Empty: plaintext, no
	// authentication, no permissions.
	TLS TLSConfig
	// Run is the run whose subjects the permissions grant; required with
	// TLS (Connect fills it with the client's run when empty).
	Run string
}

// DefaultEmbeddedServerConfig returns an embedded server on 127.0.0.1:4222 with
// NATS's 1 MiB max payload and a 256 MiB per-client outbound buffer.
func DefaultEmbeddedServerConfig() EmbeddedServerConfig {
	return EmbeddedServerConfig{
		Host:         "127.0.0.1",
		Port:         4222,
		MaxPayload:   1 << 20,
		MaxPending:   256 << 20,
		ReadyTimeout: 10 * time.Second,
	}
}

// Validate checks the server configuration.
func (s EmbeddedServerConfig) Validate() error {
	var errs []error
	if s.Host == "" {
		errs = append(errs, fmt.Errorf("%w: embedded Host is empty", ErrInvalidConfig))
	}
	if s.Port < -1 || s.Port > 65535 {
		errs = append(errs, fmt.Errorf("%w: embedded Port %d", ErrInvalidConfig, s.Port))
	}
	if s.MaxPayload < 4096 {
		errs = append(errs, fmt.Errorf("%w: embedded MaxPayload %d must be ≥ 4096", ErrInvalidConfig, s.MaxPayload))
	}
	if s.MaxPending < int64(s.MaxPayload) {
		errs = append(errs, fmt.Errorf("%w: embedded MaxPending %d must be ≥ MaxPayload", ErrInvalidConfig, s.MaxPending))
	}
	if s.ReadyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: embedded ReadyTimeout must be > 0", ErrInvalidConfig))
	}
	if s.ClusterPort < -1 || s.ClusterPort > 65535 {
		errs = append(errs, fmt.Errorf("%w: embedded ClusterPort %d", ErrInvalidConfig, s.ClusterPort))
	}
	if s.ClusterPort == 0 && (len(s.Routes) > 0 || s.ClusterName != "") {
		errs = append(errs, fmt.Errorf("%w: embedded Routes and ClusterName need a ClusterPort", ErrInvalidConfig))
	}
	if s.ClusterPort == 0 && s.ClusterAdvertise != "" {
		errs = append(errs, fmt.Errorf("%w: embedded ClusterAdvertise needs a ClusterPort", ErrInvalidConfig))
	}
	for _, a := range []string{s.ClientAdvertise, s.ClusterAdvertise} {
		if _, _, err := net.SplitHostPort(a); a != "" && err != nil {
			errs = append(errs, fmt.Errorf("%w: embedded advertise address %q: %v", ErrInvalidConfig, a, err))
		}
	}
	if s.ClusterPort != 0 && (s.ClusterName == "" || s.ClusterHost == "") {
		errs = append(errs, fmt.Errorf("%w: a cluster member needs ClusterName and ClusterHost", ErrInvalidConfig))
	}
	if s.TLS.enabled() {
		if s.TLS.CAFile == "" || s.TLS.CertFile == "" || s.TLS.KeyFile == "" || s.TLS.ServerName != "" {
			errs = append(errs, fmt.Errorf("%w: embedded TLS needs CAFile, CertFile and KeyFile (and no ServerName)", ErrInvalidConfig))
		}
		if !validToken(s.Run) {
			errs = append(errs, fmt.Errorf("%w: embedded TLS needs the Run its permissions are for, have %q", ErrInvalidConfig, s.Run))
		}
	}
	return errors.Join(errs...)
}

// DefaultConfig returns a configuration that starts an embedded server on
// 127.0.0.1:4222, reconnects forever with backoff from 100 ms to 5 s,
// declares a server dead after 3 unanswered pings 2 s apart, and buffers up
// to 512 MiB per subscription.
func DefaultConfig() Config {
	return Config{
		ClientConfig:        DefaultClientConfig(),
		Embedded:            DefaultEmbeddedServerConfig(),
		ConnectTimeout:      10 * time.Second,
		ReconnectWait:       100 * time.Millisecond,
		MaxReconnectWait:    5 * time.Second,
		MaxReconnects:       -1,
		PendingBytes:        512 << 20,
		PingInterval:        2 * time.Second,
		MaxPingsOutstanding: 3,
	}
}

// Validate checks ranges and cross-field relations. Client security
// options are rejected with an embedded server (its in-process client
// uses Embedded.TLS), rather than silently ignored.
func (c Config) Validate() error {
	errs := []error{c.ClientConfig.Validate()}
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if len(c.URLs) == 0 {
		emb := c.Embedded
		if emb.Run == "" {
			emb.Run = c.Run
		}
		errs = append(errs, emb.Validate())
		if emb.Run != c.Run {
			bad("embedded server Run %q differs from the client's run %q", emb.Run, c.Run)
		}
		if c.TLS.enabled() || c.NKeySeedFile != "" || c.CredentialsFile != "" || c.Token != "" {
			bad("client TLS and authentication options need URLs; an embedded server's client uses Embedded.TLS")
		}
	}
	for _, u := range c.URLs {
		if u == "" {
			bad("empty URL")
		}
	}
	auth := 0
	for _, s := range []string{c.NKeySeedFile, c.CredentialsFile, c.Token} {
		if s != "" {
			auth++
		}
	}
	if auth > 1 {
		bad("set at most one of NKeySeedFile, CredentialsFile, Token")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("TLS CertFile and KeyFile must be set together")
	}
	if c.TLS.CertFile != "" && c.TLS.CAFile == "" {
		bad("a TLS client certificate needs the run's CAFile, to verify the server")
	}
	if c.ConnectTimeout <= 0 {
		bad("ConnectTimeout must be > 0")
	}
	if c.ReconnectWait <= 0 || c.MaxReconnectWait < c.ReconnectWait {
		bad("need 0 < ReconnectWait ≤ MaxReconnectWait, have %v, %v", c.ReconnectWait, c.MaxReconnectWait)
	}
	if c.PingInterval <= 0 || c.MaxPingsOutstanding < 1 {
		bad("need PingInterval > 0 and MaxPingsOutstanding ≥ 1, have %v, %d", c.PingInterval, c.MaxPingsOutstanding)
	}
	if c.PendingBytes < c.WindowBytes {
		bad("PendingBytes %d must be ≥ WindowBytes %d", c.PendingBytes, c.WindowBytes)
	}
	return errors.Join(errs...)
}

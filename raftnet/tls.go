package raftnet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/pki"
)

// ErrReplicaCert is returned (wrapped, with the reason) by TLS.Check and
// LoadTLS (and so by coordinator.ReplicaConfig.Validate) when the replica's own TLS
// certificate cannot serve it: not a replica certificate, another
// replica's ID, not issued by the configured CA, or expired.
var ErrReplicaCert = errors.New("raftnet: unusable replica TLS certificate")

// ErrPeerIdentity is returned (wrapped) by TLSStream.CheckPeer (and so by
// coordinator's Replica.AddVoter) when the replica answering at the
// address of a join request does not hold a replica certificate for the ID
// the request names.
var ErrPeerIdentity = errors.New("raftnet: the replica at that address holds another identity")

// raftHandshakeTimeout bounds the TLS handshake of an accepted Raft
// connection, so that a peer that connects and says nothing holds nothing
// for long.
const raftHandshakeTimeout = 10 * time.Second

// TLS is the mutual TLS of the Raft transport (issue 12): replicas
// accept connections only from, and dial only, holders of a replica
// certificate (pki.RoleReplica) issued by the run's CA.
//
// Peers are authenticated by the CA and the role, not by host name: a
// replica dialing a peer's address checks that the certificate presented
// chains to CAs, has the ServerAuth usage and names a replica, whatever
// its SANs. Replicas are dialed by the addresses in the Raft
// configuration, which may be DNS names or IPs that change; a host name
// check would add nothing, since any replica may vote anyway.
type TLS struct {
	// CAs holds the run's CA certificate: peers must chain to it.
	CAs *x509.CertPool
	// Cert is this replica's certificate and key: a replica certificate
	// issued by the CA whose ID is the replica's (coordinator.ReplicaConfig.ID).
	Cert tls.Certificate
}

// LoadTLS reads the run's CA certificate (PEM) and this replica's
// certificate and key (PEM) from files, as written by
// `coordinator certs init`. TLS.Check (coordinator.ReplicaConfig.Validate) checks the certificate
// against the replica's ID.
func LoadTLS(caFile, certFile, keyFile string) (*TLS, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("raftnet: TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("raftnet: TLS CA: %s holds no PEM certificate", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %s, %s: %v", ErrReplicaCert, certFile, keyFile, err)
	}
	return &TLS{CAs: pool, Cert: cert}, nil
}

// Check returns an error wrapping ErrReplicaCert unless the certificate is
// a replica certificate for id that verifies against CAs now.
func (t *TLS) Check(id string) error {
	if t.CAs == nil {
		return errors.New("raftnet: replica TLS has no CA pool")
	}
	if len(t.Cert.Certificate) == 0 || t.Cert.PrivateKey == nil {
		return fmt.Errorf("%w: no certificate and key", ErrReplicaCert)
	}
	leaf := t.Cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(t.Cert.Certificate[0]); err != nil {
			return fmt.Errorf("%w: %v", ErrReplicaCert, err)
		}
	}
	role, certID, err := pki.Identity(leaf)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReplicaCert, err)
	}
	if role != pki.RoleReplica {
		return fmt.Errorf("%w: it is a %s certificate (%s), want a replica certificate", ErrReplicaCert, role, certID)
	}
	if certID != id {
		return fmt.Errorf("%w: it is replica %s's certificate, this replica is %s", ErrReplicaCert, certID, id)
	}
	if err := verifyChain(leaf, t.Cert.Certificate[1:], t.CAs, x509.ExtKeyUsageServerAuth); err != nil {
		return fmt.Errorf("%w: %v", ErrReplicaCert, err)
	}
	if err := verifyChain(leaf, t.Cert.Certificate[1:], t.CAs, x509.ExtKeyUsageClientAuth); err != nil {
		return fmt.Errorf("%w: %v", ErrReplicaCert, err)
	}
	return nil
}

func verifyChain(leaf *x509.Certificate, rest [][]byte, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
	inter := x509.NewCertPool()
	for _, der := range rest {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// requireReplica is both sides' tls.Config.VerifyConnection: the peer's
// certificate (its chain already verified against the CA on the server
// side; verified here on the client side, which skips the host name
// check, see TLS) must name a replica.
func requireReplica(roots *x509.CertPool, client bool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("peer presented no certificate")
		}
		leaf := cs.PeerCertificates[0]
		if client {
			rest := make([][]byte, 0, len(cs.PeerCertificates)-1)
			for _, c := range cs.PeerCertificates[1:] {
				rest = append(rest, c.Raw)
			}
			if err := verifyChain(leaf, rest, roots, x509.ExtKeyUsageServerAuth); err != nil {
				return err
			}
		}
		role, id, err := pki.Identity(leaf)
		if err != nil {
			return err
		}
		if role != pki.RoleReplica {
			return fmt.Errorf("peer is %s %s, not a replica", role, id)
		}
		return nil
	}
}

// TLSStream is the Raft stream layer over mutual TLS. Its own accept
// loop handshakes each connection in a goroutine (bounded by
// raftHandshakeTimeout) and hands Raft only connections from replicas, so
// a refused peer reaches no Raft code and a slow one blocks no other.
type TLSStream struct {
	*Stream
	client, server *tls.Config
	log            *slog.Logger

	conns  chan net.Conn
	ctx    context.Context // cancelled by Close: aborts handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and the handshakes

	mu         sync.Mutex
	lastWarn   time.Time
	suppressed int
}

func NewTLSStream(s *Stream, t *TLS, log *slog.Logger) *TLSStream {
	ts := &TLSStream{
		Stream: s,
		client: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{t.Cert},
			// The chain is verified in VerifyConnection, by CA and role,
			// without the host name check (see TLS).
			InsecureSkipVerify: true,
			VerifyConnection:   requireReplica(t.CAs, true),
		},
		server: &tls.Config{
			MinVersion:       tls.VersionTLS13,
			Certificates:     []tls.Certificate{t.Cert},
			ClientAuth:       tls.RequireAndVerifyClientCert,
			ClientCAs:        t.CAs,
			VerifyConnection: requireReplica(t.CAs, false),
		},
		log:   log,
		conns: make(chan net.Conn),
	}
	ts.ctx, ts.cancel = context.WithCancel(context.Background())
	ts.wg.Add(1)
	go ts.acceptLoop()
	return ts
}

func (s *TLSStream) acceptLoop() {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := s.Listener.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("raft TLS accept failed", "err", err)
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		s.wg.Add(1)
		go s.handshake(c)
	}
}

func (s *TLSStream) handshake(c net.Conn) {
	defer s.wg.Done()
	tc := tls.Server(c, s.server)
	ctx, cancel := context.WithTimeout(s.ctx, raftHandshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		c.Close()
		s.refused(c.RemoteAddr(), err)
		return
	}
	select {
	case s.conns <- tc:
	case <-s.ctx.Done():
		tc.Close()
	}
}

// refused logs a refused connection: at most one warning a second, the
// rest at debug level and counted in the next warning.
func (s *TLSStream) refused(addr net.Addr, err error) {
	s.mu.Lock()
	now := time.Now()
	warn := now.Sub(s.lastWarn) >= time.Second
	n := s.suppressed
	if warn {
		s.lastWarn, s.suppressed = now, 0
	} else {
		s.suppressed++
	}
	s.mu.Unlock()
	if warn {
		s.log.Warn("raft: refused a connection without a valid replica certificate", "remote", addr.String(), "err", err, "suppressed_before", n)
	} else {
		s.log.Debug("raft: refused a connection without a valid replica certificate", "remote", addr.String(), "err", err)
	}
}

// Accept implements net.Listener: the next connection whose peer proved
// it holds a replica certificate.
func (s *TLSStream) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener: it stops the accept loop, aborts the
// handshakes in progress and waits for their goroutines.
func (s *TLSStream) Close() error {
	s.cancel()
	err := s.Stream.Close()
	s.wg.Wait()
	return err
}

// Dial implements raft.StreamLayer: a TLS connection to a peer that
// proved it holds a replica certificate, handshaken within timeout.
func (s *TLSStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	c, err := s.dialTCP(string(address), deadline)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, s.client)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("raft TLS handshake with %s: %w", address, err)
	}
	return tc, nil
}

// CheckPeer dials address and returns nil if the replica answering there
// proves it holds a replica certificate of the CA for id; otherwise an
// error wrapping ErrPeerIdentity. The connection is closed at once (Raft,
// on the other side, sees a connection end before its first command).
func (s *TLSStream) CheckPeer(ctx context.Context, address, id string) error {
	wait := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	c, err := s.Dial(raft.ServerAddress(address), wait)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrPeerIdentity, address, err)
	}
	defer c.Close()
	certs := c.(*tls.Conn).ConnectionState().PeerCertificates
	_, got, err := pki.Identity(certs[0]) // a replica's: Dial checked it
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrPeerIdentity, address, err)
	}
	if got != id {
		return fmt.Errorf("%w: %s answers with replica %s's certificate, the request names %s", ErrPeerIdentity, address, got, id)
	}
	return nil
}

package transport_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
)

// The attack tests of issue 12 for NATS: a real embedded server with mutual
// TLS, real certificates from package pki, and attackers that are plain
// nats.go clients (an attacker is not bound to use our Client).

const tlsRun = "sec"

// testPKI writes the run's CA and certificates for replicas r1 and r2,
// nodes node-0 and node-1 and observer ops, and returns the directory.
func testPKI(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	names := []pki.Name{
		{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleReplica, ID: "r2"},
		{Role: pki.RoleNode, ID: "node-0"}, {Role: pki.RoleNode, ID: "node-1"},
		{Role: pki.RoleObserver, ID: "ops"},
	}
	if _, err := pki.Init(dir, names, nil, 1); err != nil {
		t.Fatal(err)
	}
	return dir
}

// files returns the TLS files of id in dir.
func files(dir, id string) transport.TLSConfig {
	return transport.TLSConfig{
		CAFile:   filepath.Join(dir, pki.CACertFile),
		CertFile: filepath.Join(dir, id+".crt"),
		KeyFile:  filepath.Join(dir, id+".key"),
	}
}

// startTLSServer starts an embedded server for run tlsRun with r1's
// certificate, chunking at 64 KiB.
func startTLSServer(t *testing.T, dir string) *transport.Server {
	t.Helper()
	cfg := transport.DefaultEmbeddedServerConfig()
	cfg.Port, cfg.MaxPayload, cfg.TLS, cfg.Run = -1, 64<<10, files(dir, "r1"), tlsRun
	s, err := transport.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// connect returns a Client of id over TLS to url.
func connect(t *testing.T, url, dir, id string) *transport.Client {
	t.Helper()
	c, err := dial(url, dir, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// connectCounting is connect, and counts the errors the client reports
// (ClientConfig.OnError) for which match is true: the returned function
// reads the count.
func connectCounting(t *testing.T, url, dir, id string, match func(error) bool) (*transport.Client, func() int) {
	t.Helper()
	var (
		mu sync.Mutex
		n  int
	)
	c, err := dial(url, dir, id, func(err error) {
		if match(err) {
			mu.Lock()
			n++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func dial(url, dir, id string, onError func(error)) (*transport.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs, cfg.TLS, cfg.OnError = tlsRun, []string{url}, files(dir, id), onError
	return transport.Connect(ctx, cfg, nil)
}

// tlsWith returns a client tls.Config trusting dir's CA and presenting
// cert (none if nil).
func tlsWith(t *testing.T, dir string, cert *tls.Certificate) *tls.Config {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

func certOf(t *testing.T, dir, id string) *tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// attacker is a raw nats.go connection that records the server's
// asynchronous errors (permission violations).
type attacker struct {
	nc   *nats.Conn
	mu   sync.Mutex
	errs []error
}

func rawConnect(url string, tc *tls.Config) (*attacker, error) {
	a := &attacker{}
	opts := []nats.Option{nats.Timeout(5 * time.Second), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			a.mu.Lock()
			a.errs = append(a.errs, err)
			a.mu.Unlock()
		})}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, err
	}
	a.nc = nc
	return a, nil
}

func rawAs(t *testing.T, url, dir, id string) *attacker {
	t.Helper()
	a, err := rawConnect(url, tlsWith(t, dir, certOf(t, dir, id)))
	if err != nil {
		t.Fatalf("%s connects: %v", id, err)
	}
	t.Cleanup(a.nc.Close)
	return a
}

// refused waits for the server's permissions violation for op ("Publish"
// or "Subscription") on subject.
func (a *attacker) refused(t *testing.T, op, subject string) {
	t.Helper()
	want := fmt.Sprintf("Permissions Violation for %s to %q", op, subject)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		for _, err := range a.errs {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
				a.mu.Unlock()
				return
			}
		}
		a.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	t.Errorf("no %q from the server; errors: %v", want, a.errs)
}

func (a *attacker) publish(t *testing.T, subject string, data []byte) {
	t.Helper()
	if err := a.nc.Publish(subject, data); err != nil {
		t.Fatal(err)
	}
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// sink counts the messages on subject seen by a replica's connection.
type sink struct {
	mu sync.Mutex
	n  int
}

func (s *sink) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.n }

func listen(t *testing.T, a *attacker, subject string) *sink {
	t.Helper()
	s := &sink{}
	if _, err := a.nc.Subscribe(subject, func(*nats.Msg) { s.mu.Lock(); s.n++; s.mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTLSRefusesClientsWithoutCertificate: with TLS, a client in plaintext,
// one with TLS but no certificate, and our own Client without TLS
// options cannot connect.
func TestTLSRefusesClientsWithoutCertificate(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	hostPort := strings.TrimPrefix(srv.URL(), "tls://")
	if a, err := rawConnect("nats://"+hostPort, nil); err == nil {
		a.nc.Close()
		t.Error("a plaintext client connected")
	}
	if a, err := rawConnect("tls://"+hostPort, tlsWith(t, dir, nil)); err == nil {
		a.nc.Close()
		t.Error("a TLS client without a certificate connected")
	}
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs = tlsRun, []string{"nats://" + hostPort}
	if c, err := transport.Connect(context.Background(), cfg, nil); err == nil {
		c.Close()
		t.Error("transport.Connect without TLS connected")
	}
	// The same client with a certificate connects.
	c := connect(t, srv.URL(), dir, "node-0")
	if got, want := c.ID(), "node.node-0."; !strings.HasPrefix(got, want) {
		t.Errorf("client ID %q, want prefix %q (from the certificate)", got, want)
	}
	// The refused handshakes are counted (issue 27: they were neither
	// logged nor counted).
	if n, _ := srv.Refused(); n == 0 {
		t.Error("the server counted no refused TLS handshake")
	}
}

// TestTLSRefusalsLogged: the server logs a refused TLS handshake and a
// permissions violation at warn level, and counts them.
func TestTLSRefusalsLogged(t *testing.T) {
	dir := testPKI(t)
	var buf lockedLog
	cfg := transport.DefaultEmbeddedServerConfig()
	cfg.Port, cfg.MaxPayload, cfg.TLS, cfg.Run = -1, 64<<10, files(dir, "r1"), tlsRun
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	srv, err := transport.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	hostPort := strings.TrimPrefix(srv.URL(), "tls://")
	if a, err := rawConnect("tls://"+hostPort, tlsWith(t, dir, nil)); err == nil {
		a.nc.Close()
		t.Fatal("a TLS client without a certificate connected")
	}
	evil := rawAs(t, srv.URL(), dir, "node-1")
	s, _ := transport.NewSubjects(tlsRun)
	subject, _ := s.Node(transport.TopicContributions, "node-0")
	evil.publish(t, subject, []byte("x"))
	evil.refused(t, "Publish", subject)
	deadline := time.Now().Add(5 * time.Second)
	for {
		tlsN, permN := srv.Refused()
		logs := buf.String()
		if tlsN > 0 && permN > 0 && strings.Contains(logs, "level=WARN") && strings.Contains(logs, "TLS handshake error") &&
			strings.Contains(logs, "Violation") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused: %d TLS handshakes, %d permissions; log:\n%s", tlsN, permN, logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockedLog is a log sink the server's goroutines and the test share.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestTLSRefusesOtherCA: a certificate of another CA, even for a replica
// ID of the run, is refused; so is a certificate of the run's CA that
// names no dpcluster identity.
func TestTLSRefusesOtherCA(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	ca, err := pki.NewCA(1)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.Issue(ca, pki.RoleReplica, "r1", nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	other := kp.TLSCertificate()
	if a, err := rawConnect(srv.URL(), tlsWith(t, dir, &other)); err == nil {
		a.nc.Close()
		t.Error("a certificate of another CA was accepted")
	}
	anon := anonymousCert(t, dir)
	a, err := rawConnect(srv.URL(), tlsWith(t, dir, &anon))
	if err == nil {
		a.nc.Close()
		t.Error("a certificate without a dpcluster identity was accepted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("certificate without identity: %v, want an authorization violation", err)
	}
}

// anonymousCert returns a client certificate issued by the run's CA whose
// subject and SANs name no dpcluster identity.
func anonymousCert(t *testing.T, dir string) tls.Certificate {
	t.Helper()
	return craftCert(t, dir, pkix.Name{CommonName: "r1", OrganizationalUnit: []string{"replica"}}, nil, x509.ExtKeyUsageClientAuth)
}

// craftCert returns a certificate issued by the run's CA for 127.0.0.1
// with subject, URI SANs and extended key usages of the test's choosing
// (what a bring-your-own CA might issue).
func craftCert(t *testing.T, dir string, subject pkix.Name, uris []*url.URL, usages ...x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(77), Subject: subject, URIs: uris,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestTLSNodePermissions: a node's certificate cannot subscribe to dpc.>
// or to the contributions, nor publish rounds, parameters, leader
// announcements, status or control messages: the server refuses each with
// a permissions violation, and a replica subscribed there receives
// nothing. What a node must do still works.
func TestTLSNodePermissions(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	s, _ := transport.NewSubjects(tlsRun)
	replica := rawAs(t, srv.URL(), dir, "r2")
	node := rawAs(t, srv.URL(), dir, "node-0")

	// Reading other nodes' contributions.
	for _, subject := range []string{"dpc.>", s.Topic(transport.TopicContributions), "dpc." + tlsRun + ".>", ">"} {
		if _, err := node.nc.Subscribe(subject, func(*nats.Msg) { t.Errorf("node received a message on %s", subject) }); err != nil {
			t.Fatal(err)
		}
		if err := node.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		node.refused(t, "Subscription", subject)
	}
	other := rawAs(t, srv.URL(), dir, "node-1")
	other.publish(t, s.Topic(transport.TopicContributions), []byte("sum of node-1"))

	// Speaking for the coordinator.
	for _, topic := range []transport.Topic{transport.TopicRounds, transport.TopicParams, transport.TopicLeader,
		transport.TopicStatus, transport.TopicControl} {
		subject := s.Topic(topic)
		got := listen(t, replica, subject)
		node.publish(t, subject, []byte("forged"))
		node.refused(t, "Publish", subject)
		if err := replica.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if n := got.count(); n != 0 {
			t.Errorf("a replica received %d forged messages on %s", n, subject)
		}
	}

	// Our own Client reports a refused subscription as ErrPermission.
	c := connect(t, srv.URL(), dir, "node-0")
	if _, err := c.Subscribe(transport.TopicContributions, func(transport.Message) {}); !errors.Is(err, transport.ErrPermission) {
		t.Errorf("node Client subscribing to contributions: %v, want ErrPermission", err)
	}
	if _, err := c.Subscribe(transport.TopicControl, func(transport.Message) {}); !errors.Is(err, transport.ErrPermission) {
		t.Errorf("node Client subscribing to control: %v, want ErrPermission", err)
	}

	// What a node does: read rounds, send a contribution to the replicas.
	rounds := make(chan transport.Message, 1)
	if _, err := c.Subscribe(transport.TopicRounds, func(m transport.Message) { rounds <- m }); err != nil {
		t.Fatal(err)
	}
	r := connect(t, srv.URL(), dir, "r1")
	contribs := make(chan transport.Message, 1)
	if _, err := r.Subscribe(transport.TopicContributions, func(m transport.Message) { contribs <- m }); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Publish(ctx, transport.RoundStart{Run: tlsRun, Step: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, transport.Contribution{Run: tlsRun, Step: 1, NodeID: "node-0", Count: 1, Sum: transport.Vector{1}}); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan transport.Message{rounds, contribs} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("a permitted message did not arrive")
		}
	}
}

// TestTLSObserverPermissions: an observer reads status, leader, nodes and
// control, and can neither read contributions or parameters nor publish
// on any topic.
func TestTLSObserverPermissions(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	s, _ := transport.NewSubjects(tlsRun)
	obs := rawAs(t, srv.URL(), dir, "ops")
	for _, topic := range []transport.Topic{transport.TopicContributions, transport.TopicParams, transport.TopicRounds} {
		if _, err := obs.nc.Subscribe(s.Topic(topic), func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		if err := obs.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		obs.refused(t, "Subscription", s.Topic(topic))
	}
	for topic := transport.TopicNodes; topic <= transport.TopicControl; topic++ {
		obs.publish(t, s.Topic(topic), []byte("x"))
		obs.refused(t, "Publish", s.Topic(topic))
	}
	c := connect(t, srv.URL(), dir, "ops")
	for _, topic := range []transport.Topic{transport.TopicStatus, transport.TopicLeader, transport.TopicNodes, transport.TopicControl} {
		if _, err := c.Subscribe(topic, func(transport.Message) {}); err != nil {
			t.Errorf("observer subscribing to %v: %v", topic, err)
		}
	}
}

// TestTLSNackCannotRedirect: a node cannot have a replica's chunks resent
// to another client's inbox, nor another node's (its contributions) to
// its own: a NACK naming another receiver than its publisher is refused by
// the server, one whose body disagrees with its subject is rejected by
// the sender, and a NACK to a node from a node is refused. The node's
// own NACK is answered.
func TestTLSNackCannotRedirect(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	s, _ := transport.NewSubjects(tlsRun)
	ctx := context.Background()

	coord, rejections := connectCounting(t, srv.URL(), dir, "r1", func(error) bool { return true })
	params := transport.Params{Run: tlsRun, Step: 1, Version: 1, Values: make(transport.Vector, 50_000)} // 200 kB: 4 chunks
	if err := coord.Publish(ctx, params); err != nil {
		t.Fatal(err)
	}
	if coord.Stats().ChunkedSent != 1 {
		t.Fatal("the params were not chunked")
	}

	victim := ""
	{
		c := connect(t, srv.URL(), dir, "node-0")
		victim = c.ID()
	}
	r2 := rawAs(t, srv.URL(), dir, "r2")
	victimInbox := listen(t, r2, s.Inbox(victim))
	nack := func(rcv string) []byte {
		b, err := msgpack.Marshal([]any{1, 17, map[string]any{"rcv": rcv, "xfer": 1, "missing": []uint32{0, 1, 2, 3}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	evil := rawAs(t, srv.URL(), dir, "node-1")

	// 1. A NACK naming the victim as receiver: refused by the server.
	subject := s.Nack(coord.ID(), victim)
	evil.publish(t, subject, nack(victim))
	evil.refused(t, "Publish", subject)

	// 2. On its own NACK subject, with a body naming the victim: rejected
	// by the sender, nothing resent.
	self := transport.ClientID(pki.RoleNode, "node-1", "0123456789abcdef")
	evil.publish(t, s.Nack(coord.ID(), self), nack(victim))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if rejections() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sender did not reject a NACK naming another inbox")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := coord.Stats().Retransmitted; got != 0 {
		t.Errorf("the sender resent %d chunks for a redirected NACK", got)
	}

	// 3. Its own, honest NACK is answered, to its own inbox.
	own := listen(t, evil, s.Inbox(self))
	evil.publish(t, s.Nack(coord.ID(), self), nack(self))
	deadline = time.Now().Add(5 * time.Second)
	for own.count() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the node's own NACK got %d of 4 chunks", own.count())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := victimInbox.count(); n != 0 {
		t.Errorf("the victim's inbox received %d chunks", n)
	}

	// 4. A node NACKing a node (to get its contributions): refused.
	subject = s.Nack(victim, self)
	evil.publish(t, subject, nack(self))
	evil.refused(t, "Publish", subject)
	// and a node resending to another node's inbox: refused.
	subject = s.Inbox(victim)
	evil.publish(t, subject, []byte("forged chunk"))
	evil.refused(t, "Publish", subject)
	if err := r2.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := victimInbox.count(); n != 0 {
		t.Errorf("the victim's inbox received %d messages", n)
	}
}

// TestTLSClientIdentity: a Client's role and name come from its
// certificate; a configured name that disagrees is refused, and so is a
// server certificate that is not a replica's.
func TestTLSClientIdentity(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs, cfg.TLS, cfg.Name = tlsRun, []string{srv.URL()}, files(dir, "node-0"), "node-1"
	if c, err := transport.Connect(context.Background(), cfg, nil); !errors.Is(err, transport.ErrCertificate) {
		if err == nil {
			c.Close()
		}
		t.Errorf("a client named node-1 with node-0's certificate: %v, want ErrCertificate", err)
	}
	scfg := transport.DefaultEmbeddedServerConfig()
	scfg.Port, scfg.TLS, scfg.Run = -1, files(dir, "node-0"), tlsRun
	if s, err := transport.StartServer(scfg); !errors.Is(err, transport.ErrCertificate) {
		if err == nil {
			s.Shutdown()
		}
		t.Errorf("a server with a node certificate: %v, want ErrCertificate", err)
	}
	// An embedded server with TLS: its own client connects with the same
	// certificate, and other clients need theirs.
	ecfg := transport.DefaultConfig()
	ecfg.Run, ecfg.Embedded.Port, ecfg.Embedded.TLS = tlsRun, -1, files(dir, "r2")
	emb, err := transport.Connect(context.Background(), ecfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Close()
	if !strings.HasPrefix(emb.ServerURL(), "tls://") || !strings.HasPrefix(emb.ID(), "replica.r2.") {
		t.Errorf("embedded TLS server %s, client %s", emb.ServerURL(), emb.ID())
	}
	connect(t, emb.ServerURL(), dir, "node-1")
	if a, err := rawConnect(strings.Replace(emb.ServerURL(), "tls://", "nats://", 1), nil); err == nil {
		a.nc.Close()
		t.Error("a plaintext client connected to the embedded TLS server")
	}
}

// TestTLSClientChecksServer: a client refuses a server whose certificate
// is not valid for the host it dials, and a server holding a node's
// certificate of the run (a node posing as a NATS server).
func TestTLSClientChecksServer(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs, cfg.TLS = tlsRun, []string{srv.URL()}, files(dir, "node-0")
	cfg.TLS.ServerName = "coord.example.com" // not in the certificate's SANs
	if c, err := transport.Connect(context.Background(), cfg, nil); err == nil {
		c.Close()
		t.Error("the client accepted a server certificate for another host")
	}

	// pki gives nodes no ServerAuth usage, which already stops a node's
	// certificate from serving; another CA might, so the client also
	// checks the role.
	nodeServer := craftCert(t, dir, pkix.Name{CommonName: "node-9", OrganizationalUnit: []string{"node"}},
		[]*url.URL{pki.IdentityURI(pki.RoleNode, "node-9")}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	sc := tlsWith(t, dir, &nodeServer)
	sc.ClientCAs, sc.ClientAuth = sc.RootCAs, tls.RequireAndVerifyClientCert
	rogue, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		TLS: true, TLSVerify: true, TLSConfig: sc, TLSTimeout: 5})
	if err != nil {
		t.Fatal(err)
	}
	go rogue.Start()
	defer rogue.Shutdown()
	if !rogue.ReadyForConnections(10 * time.Second) {
		t.Fatal("rogue server not ready")
	}
	a, err := rawConnect(rogue.ClientURL(), tlsWith(t, dir, certOf(t, dir, "node-0")))
	if err != nil {
		t.Fatalf("control: a plain client does not reach the rogue server: %v", err)
	}
	a.nc.Close()
	if _, err := dial(rogue.ClientURL(), dir, "node-0", nil); err == nil || !strings.Contains(err.Error(), "not a replica") {
		t.Errorf("our client connected to a server holding a node certificate: %v", err)
	}
}

// TestTLSRoutes: two embedded servers route over mutual TLS with replica
// certificates and carry a message between their clients; a server
// holding a node's certificate cannot join their cluster.
func TestTLSRoutes(t *testing.T) {
	dir := testPKI(t)
	start := func(id string, routes ...string) *transport.Server {
		t.Helper()
		cfg := transport.DefaultEmbeddedServerConfig()
		cfg.Port, cfg.ClusterName, cfg.ClusterHost, cfg.ClusterPort, cfg.Routes = -1, "dpc", "127.0.0.1", -1, routes
		cfg.TLS, cfg.Run = files(dir, id), tlsRun
		s, err := transport.StartServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
		return s
	}
	a := start("r1")
	b := start("r2", "nats-route://"+a.ClusterAddr())
	deadline := time.Now().Add(10 * time.Second)
	for a.NumRoutes() == 0 || b.NumRoutes() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the servers did not route to each other over TLS")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sub := connect(t, a.URL(), dir, "node-0")
	got := make(chan transport.Message, 8)
	if _, err := sub.Subscribe(transport.TopicLeader, func(m transport.Message) { got <- m }); err != nil {
		t.Fatal(err)
	}
	pub := connect(t, b.URL(), dir, "r2")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for arrived := false; !arrived; {
		if err := pub.Publish(context.Background(), transport.Leader{Run: tlsRun, ReplicaID: "r2", Term: 1}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
			arrived = true
		case <-tick.C:
			if time.Now().After(deadline) {
				t.Fatal("no message across the TLS route")
			}
		}
	}

	routes := a.NumRoutes() // to b (nats-server pools several routes per peer)
	// A rogue server with a node's certificate (a plain nats-server: our
	// StartServer refuses the certificate) dials a's routes.
	node := certOf(t, dir, "node-1")
	rc := tlsWith(t, dir, node)
	rc.ClientCAs, rc.ClientAuth = rc.RootCAs, tls.RequireAndVerifyClientCert
	rogue, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Cluster: server.ClusterOpts{Name: "dpc", Host: "127.0.0.1", Port: -1, TLSConfig: rc, TLSTimeout: 5},
		Routes:  server.RoutesFromStr("nats-route://" + a.ClusterAddr()),
	})
	if err != nil {
		t.Fatal(err)
	}
	go rogue.Start()
	defer rogue.Shutdown()
	if !rogue.ReadyForConnections(10 * time.Second) {
		t.Fatal("rogue server not ready")
	}
	// The rogue retries its route every second or so; in 3 s it would
	// have connected if it could.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := rogue.NumRoutes(); n != 0 {
			t.Fatalf("a server with a node certificate routed to the cluster (%d routes)", n)
		}
	}
	if n := a.NumRoutes(); n != routes {
		t.Errorf("a has %d routes, had %d to b alone", n, routes)
	}
}

// TestTLSNodeSpeaksOnlyForItself: node-1's certificate cannot publish on
// node-0's subjects (nor on the bare topic subjects): the server refuses
// it. On its own subjects, a Join, Heartbeat, NeedParams, Leave or
// Contribution (whole or chunked) naming node-0 reaches the replica's
// connection and is dropped there (ErrWrongSender), never delivered. node-0's
// own messages are delivered.
func TestTLSNodeSpeaksOnlyForItself(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	s, _ := transport.NewSubjects(tlsRun)
	ctx := context.Background()
	replica, wrong := connectCounting(t, srv.URL(), dir, "r1", func(err error) bool { return errors.Is(err, transport.ErrWrongSender) })
	got := make(chan transport.Message, 100)
	for _, topic := range []transport.Topic{transport.TopicNodes, transport.TopicContributions} {
		if _, err := replica.Subscribe(topic, func(m transport.Message) { got <- m }); err != nil {
			t.Fatal(err)
		}
	}
	node := func(topic transport.Topic, id string) string {
		t.Helper()
		subject, err := s.Node(topic, id)
		if err != nil {
			t.Fatal(err)
		}
		return subject
	}
	forgeries := []transport.Message{
		transport.Join{Run: tlsRun, NodeID: "node-0", ShardSize: 10},
		transport.Heartbeat{Run: tlsRun, NodeID: "node-0", Step: 3},
		transport.NeedParams{Run: tlsRun, NodeID: "node-0", Version: 3},
		transport.Leave{Run: tlsRun, NodeID: "node-0"},
		transport.Contribution{Run: tlsRun, Step: 4, NodeID: "node-0", Count: 1, Sum: transport.Vector{1}},
	}
	evil := rawAs(t, srv.URL(), dir, "node-1")
	r2 := rawAs(t, srv.URL(), dir, "r2")

	// 1. On node-0's subjects, or the bare topics: refused by the server.
	for _, subject := range []string{node(transport.TopicNodes, "node-0"), node(transport.TopicContributions, "node-0"),
		s.Topic(transport.TopicNodes), s.Topic(transport.TopicContributions)} {
		seen := listen(t, r2, subject)
		evil.publish(t, subject, []byte("forged"))
		evil.refused(t, "Publish", subject)
		if err := r2.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if n := seen.count(); n != 0 {
			t.Errorf("a replica received %d messages node-1 published on %s", n, subject)
		}
	}
	// The same through our Client, which publishes on the subject of the
	// node a message names: refused by the server, never delivered.
	c1 := connect(t, srv.URL(), dir, "node-1")
	for _, m := range forgeries {
		if err := c1.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	// 2. On its own subjects, in node-0's name: dropped by the replica.
	for _, m := range forgeries {
		data, err := transport.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		evil.publish(t, node(m.Type().Topic(), "node-1"), data)
	}
	big := transport.Contribution{Run: tlsRun, Step: 4, NodeID: "node-0", Count: 1, Sum: make(transport.Vector, 50_000)} // 4 chunks
	frames, err := transport.SplitFrames(big, transport.ClientID(pki.RoleNode, "node-1", "0123456789abcdef"), 1, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		evil.publish(t, node(transport.TopicContributions, "node-1"), f)
	}
	want := len(forgeries) + 1
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := wrong()
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica dropped %d messages in node-0's name, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := replica.Stats().WrongSender; n != uint64(want) {
		t.Errorf("Stats().WrongSender = %d, want %d", n, want)
	}

	// 3. node-0's own messages, published after, are the first delivered.
	c0 := connect(t, srv.URL(), dir, "node-0")
	own := []transport.Message{
		transport.Join{Run: tlsRun, NodeID: "node-0", ShardSize: 99},
		transport.Contribution{Run: tlsRun, Step: 4, NodeID: "node-0", Count: 7, Sum: make(transport.Vector, 50_000)},
	}
	for _, m := range own {
		if err := c0.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-got:
			if !reflect.DeepEqual(got, m) {
				t.Errorf("delivered %v %+.60v, want node-0's own", got.Type(), got)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("node-0's own message was not delivered")
		}
	}
	select {
	case m := <-got:
		t.Errorf("a further %v was delivered", m.Type())
	case <-time.After(100 * time.Millisecond):
	}
}

// TestTLSChunkBomb is issue 27's finding 1 over a real TLS server: a
// node publishing on its own contribution subject three single chunks,
// each announcing a 1 GiB transfer (16 MiB here), made every replica reserve the whole
// buffer and fill the shared reassembly budget, so the honest nodes'
// chunked contributions were refused. With the contribution topic limited
// to a contribution's size for the run's model (LimitTopic, as the
// coordinator sets it), the bombs are refused at their first chunk,
// counted, and node-0's contribution arrives.
func TestTLSChunkBomb(t *testing.T) {
	dir := testPKI(t)
	srv := startTLSServer(t, dir)
	s, _ := transport.NewSubjects(tlsRun)
	ctx := context.Background()
	replica, tooLarge := connectCounting(t, srv.URL(), dir, "r1", func(err error) bool { return errors.Is(err, transport.ErrTooLarge) })
	const dim = 50_000 // 4 chunks of 64 KiB
	replica.LimitTopic(transport.TopicContributions, transport.ContributionMaxBytes(dim))
	got := make(chan transport.Message, 10)
	if _, err := replica.Subscribe(transport.TopicContributions, func(m transport.Message) { got <- m }); err != nil {
		t.Fatal(err)
	}
	subject, err := s.Node(transport.TopicContributions, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	evil := rawAs(t, srv.URL(), dir, "node-1")
	for i := range 3 {
		// A 16 MiB contribution's first chunk (1 GiB in the probe; the
		// limit here is about 200 KB either way).
		bomb := transport.Contribution{Run: tlsRun, Step: 4, NodeID: "node-1", Count: 1, Sum: make(transport.Vector, 1<<22)}
		frames, err := transport.SplitFrames(bomb, transport.ClientID(pki.RoleNode, "node-1", "0123456789abcdef"), uint64(10+i), 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		evil.publish(t, subject, frames[0])
	}
	deadline := time.Now().Add(5 * time.Second)
	for tooLarge() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the replica refused %d of the 3 bombs as too large", tooLarge())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := replica.Stats().TooLarge; n != 3 {
		t.Errorf("Stats().TooLarge = %d, want 3", n)
	}
	c0 := connect(t, srv.URL(), dir, "node-0")
	own := transport.Contribution{Run: tlsRun, Step: 4, NodeID: "node-0", Count: 7, Sum: make(transport.Vector, dim)}
	if err := c0.Publish(ctx, own); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if c, ok := m.(transport.Contribution); !ok || c.NodeID != "node-0" || len(c.Sum) != dim {
			t.Errorf("delivered %v, want node-0's contribution", m.Type())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node-0's contribution was not delivered after the bombs")
	}
}

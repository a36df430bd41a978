package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/nats-io/nats.go"

	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
)

// tlsFiles returns id's TLS files in the run's directory dir.
func tlsFiles(dir, id string) transport.TLSConfig {
	return transport.TLSConfig{
		CAFile:   filepath.Join(dir, pki.CACertFile),
		CertFile: filepath.Join(dir, id+".crt"),
		KeyFile:  filepath.Join(dir, id+".key"),
	}
}

// rawNATS connects to url as a plain nats.go client (what an attacker
// would use) presenting id's certificate, and returns the connection and
// the asynchronous errors the server sends it.
func rawNATS(t *testing.T, url, dir, id string) (*nats.Conn, func() []error) {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var errs []error
	nc, err := nats.Connect(url, nats.NoReconnect(),
		nats.Secure(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, func() []error { mu.Lock(); defer mu.Unlock(); return append([]error(nil), errs...) }
}

// TestNodeCannotChangeMembership: over NATS with TLS, a node's certificate
// can neither remove a replica nor add one: the server refuses its
// control messages (and a Status on the status subject, where membership
// requests used to travel) with a permissions violation, and the Raft
// configuration does not change. The control case: the same join request
// published with a replica's certificate adds the replica.
func TestNodeCannotChangeMembership(t *testing.T) {
	dir := testPKI(t)
	c := testRunConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	srv, dial := tlsServer(t, ctx, dir, c.Run)

	peers := []raft.Server{{ID: "r1", Address: raft.ServerAddress(freeAddr(t))}, {ID: "r2", Address: raft.ServerAddress(freeAddr(t))}}
	open := func(id, addr string, bootstrap bool) *Replica {
		t.Helper()
		cfg := DefaultReplicaConfig()
		cfg.ID, cfg.RaftAddr, cfg.DataDir, cfg.Bootstrap = id, addr, t.TempDir(), bootstrap
		if bootstrap {
			cfg.Peers = peers
		}
		cfg.TLS = loadTLS(t, dir, id)
		r, err := OpenReplica(cfg, testInit)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	reps := []*Replica{open("r1", string(peers[0].Address), true), open("r2", string(peers[1].Address), true)}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	serve := func(r *Replica, join bool) {
		t.Helper()
		cfg := DefaultServerConfig()
		cfg.Noise, cfg.AnnounceEvery, cfg.Join = mechanism.NewSeededNoiseSource(1), 100*time.Millisecond, join
		s, err := NewServer(r, dial(r.ID()), c, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = s.Run(ctx) }()
	}
	for _, r := range reps {
		serve(r, false)
	}
	var leader *Replica
	for leader == nil && ctx.Err() == nil {
		for _, r := range reps {
			if r.IsLeader() {
				leader = r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	follower := reps[0]
	if follower == leader {
		follower = reps[1]
	}
	r3Addr := freeAddr(t)
	r3 := open("r3", r3Addr, false)

	nc, errs := rawNATS(t, srv.URL(), dir, "node-0")
	subjects, _ := transport.NewSubjects(c.Run)
	for _, m := range []transport.Message{
		transport.Control{Run: c.Run, From: "node-0", Code: transport.ControlRemove, Replica: follower.ID()},
		transport.Control{Run: c.Run, From: "r3", Code: transport.ControlJoin, Addr: r3Addr},
		transport.Status{Run: c.Run, From: "node-0", Node: follower.ID(), Code: 9}, // the old removal request
	} {
		data, err := transport.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		subject := subjects.Topic(m.Type().Topic())
		if err := nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("Permissions Violation for Publish to %q", subject)
		for !hasError(errs(), want) {
			if ctx.Err() != nil {
				t.Fatalf("no %q; errors %v", want, errs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Control: r3, holding its replica certificate, asks to join (as
	// serve --join does) and is added. The node's requests, published
	// before, changed nothing.
	serve(r3, true)
	for !leader.HasVoter("r3", r3Addr) {
		if ctx.Err() != nil {
			t.Fatal("r3's own join request was not honoured")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !leader.HasVoter(follower.ID(), "") {
		t.Errorf("%s was removed by a node's request", follower.ID())
	}
}

func hasError(errs []error, want string) bool {
	for _, err := range errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
			return true
		}
	}
	return false
}

// TestAddVoterChecksIdentity: with Raft over TLS, a join request naming an
// ID is honoured only if the replica at its address holds that ID's
// certificate.
func TestAddVoterChecksIdentity(t *testing.T) {
	dir := testPKI(t)
	cfg := testReplicaConfig(t.TempDir(), freeAddr(t))
	cfg.TLS = loadTLS(t, dir, "r1")
	leader, err := OpenReplica(cfg, testInit)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	waitLeader(t, leader)
	cfg3 := DefaultReplicaConfig()
	cfg3.ID, cfg3.RaftAddr, cfg3.DataDir, cfg3.TLS = "r3", freeAddr(t), t.TempDir(), loadTLS(t, dir, "r3")
	r3, err := OpenReplica(cfg3, testInit)
	if err != nil {
		t.Fatal(err)
	}
	defer r3.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := leader.AddVoter(ctx, "r2", r3.Addr()); !errors.Is(err, ErrPeerIdentity) {
		t.Fatalf("AddVoter naming r2 at r3's address: %v, want ErrPeerIdentity", err)
	}
	if leader.HasVoter("r2", "") {
		t.Fatal("r2 added at r3's address")
	}
	if err := leader.AddVoter(ctx, "r3", r3.Addr()); err != nil {
		t.Fatalf("AddVoter r3: %v", err)
	}
	if !leader.HasVoter("r3", r3.Addr()) {
		t.Error("r3 not a voter")
	}
}

// tlsServer starts an embedded NATS server for run with mutual TLS (r1's
// replica certificate from the test PKI in dir), shut down at the end of
// the test, and returns it with a dial function that connects a client
// presenting id's certificate.
func tlsServer(t *testing.T, ctx context.Context, dir, run string) (*transport.Server, func(id string) *transport.Client) {
	t.Helper()
	scfg := transport.DefaultEmbeddedServerConfig()
	scfg.Port, scfg.TLS, scfg.Run = -1, tlsFiles(dir, "r1"), run
	srv, err := transport.StartServer(scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	dial := func(id string) *transport.Client {
		t.Helper()
		cfg := transport.DefaultConfig()
		cfg.Run, cfg.URLs, cfg.TLS = run, []string{srv.URL()}, tlsFiles(dir, id)
		conn, err := transport.Connect(ctx, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	return srv, dial
}

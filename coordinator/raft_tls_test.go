package coordinator

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/raftnet"
)

// testPKI writes a run's CA and certificates for replicas r1..r3, node-0
// and node-1, and observer ops into a temporary directory and returns it.
func testPKI(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	names := []pki.Name{
		{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleReplica, ID: "r2"}, {Role: pki.RoleReplica, ID: "r3"},
		{Role: pki.RoleNode, ID: "node-0"}, {Role: pki.RoleNode, ID: "node-1"}, {Role: pki.RoleObserver, ID: "ops"},
	}
	if _, err := pki.Init(dir, names, nil, 1); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadTLS loads id's certificate from the run's directory dir.
func loadTLS(t *testing.T, dir, id string) *raftnet.TLS {
	t.Helper()
	rt, err := raftnet.LoadTLS(filepath.Join(dir, pki.CACertFile), filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// otherCACert returns a replica certificate for id issued by a CA that is
// not the run's.
func otherCACert(t *testing.T, id string) tls.Certificate {
	t.Helper()
	ca, err := pki.NewCA(1)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.Issue(ca, pki.RoleReplica, id, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	return kp.TLSCertificate()
}

// TestReplicasOverTLS: three replicas holding replica certificates form a
// cluster over mutual TLS, elect a leader and replicate steps to all.
func TestReplicasOverTLS(t *testing.T) {
	dir := testPKI(t)
	var peers []raft.Server
	for i := range 3 {
		peers = append(peers, raft.Server{ID: raft.ServerID(fmt.Sprintf("r%d", i+1)), Address: raft.ServerAddress(freeAddr(t))})
	}
	var reps []*Replica
	t.Cleanup(func() {
		for _, r := range reps {
			r.Close()
		}
	})
	for _, p := range peers {
		cfg := DefaultReplicaConfig()
		cfg.ID, cfg.RaftAddr, cfg.DataDir, cfg.Bootstrap, cfg.Peers = string(p.ID), string(p.Address), t.TempDir(), true, peers
		cfg.TLS = loadTLS(t, dir, string(p.ID))
		r, err := OpenReplica(cfg, testInit)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
	}
	var leader *Replica
	deadline := time.Now().Add(15 * time.Second)
	for leader == nil {
		if time.Now().After(deadline) {
			t.Fatal("no leader elected over TLS")
		}
		for _, r := range reps {
			if r.IsLeader() {
				leader = r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitLeader(t, leader)
	runSteps(t, leader, testRunConfig(), noisyGrads(3, 7), 1, 3)
	for _, r := range reps {
		for {
			if _, step := r.FSM().Params(nil); step == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %s did not apply step 3", r.ID())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// attackStream is a stream layer for an attacker's raft.NetworkTransport:
// it dials in plaintext, or over TLS with cert when tlsConfig is set.
type attackStream struct {
	net.Listener
	tlsConfig *tls.Config
}

func (s attackStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil || s.tlsConfig == nil {
		return c, err
	}
	return tls.Client(c, s.tlsConfig), nil
}

// attack sends a RequestVote and an AppendEntries RPC with a term 10
// above the replica's to r, as a transport dialing with tlsConfig (nil:
// plaintext), and returns the errors, and whether the vote was granted.
func attack(t *testing.T, r *Replica, tlsConfig *tls.Config) (voteErr, appendErr error, granted bool) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransport(attackStream{l, tlsConfig}, 1, 2*time.Second, io.Discard)
	defer tr.Close()
	term := r.Term()
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("evil"), Addr: []byte(l.Addr().String())}
	var vote raft.RequestVoteResponse
	voteErr = tr.RequestVote(raft.ServerID(r.ID()), raft.ServerAddress(r.Addr()), &raft.RequestVoteRequest{
		RPCHeader: hdr, Term: term + 10, LastLogIndex: 1 << 40, LastLogTerm: term + 10,
	}, &vote)
	var app raft.AppendEntriesResponse
	appendErr = tr.AppendEntries(raft.ServerID(r.ID()), raft.ServerAddress(r.Addr()), &raft.AppendEntriesRequest{
		RPCHeader: hdr, Term: term + 10,
	}, &app)
	return voteErr, appendErr, voteErr == nil && vote.Granted
}

// TestRaftRefusesNonReplicas: a transport without a replica certificate of
// the run's CA (a node's, an observer's, another CA's replica certificate,
// plaintext) gets no vote and no append accepted: its RPCs fail and the
// replica's term does not move. The control case shows the same plaintext
// attack does move the term of a replica without TLS.
func TestRaftRefusesNonReplicas(t *testing.T) {
	dir := testPKI(t)
	keyPair := func(id string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	client := func(c tls.Certificate) *tls.Config {
		return &tls.Config{Certificates: []tls.Certificate{c}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	}

	t.Run("control: plaintext against a replica without TLS", func(t *testing.T) {
		r := openTestReplica(t, t.TempDir(), freeAddr(t))
		defer r.Close()
		waitLeader(t, r)
		before := r.Term()
		_, appendErr, _ := attack(t, r, nil)
		if appendErr != nil {
			t.Fatalf("AppendEntries: %v", appendErr)
		}
		if got := r.Term(); got <= before {
			t.Fatalf("term %d after the attack, was %d: the control attack did not reach Raft", got, before)
		}
	})

	cfg := testReplicaConfig(t.TempDir(), freeAddr(t))
	cfg.TLS = loadTLS(t, dir, "r1")
	r, err := OpenReplica(cfg, testInit)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	waitLeader(t, r)
	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{
		{"plaintext", nil},
		{"node certificate", client(keyPair("node-0"))},
		{"observer certificate", client(keyPair("ops"))},
		{"another CA's replica certificate", client(otherCACert(t, "r2"))},
		{"no certificate", &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.Term()
			voteErr, appendErr, granted := attack(t, r, tc.tls)
			if voteErr == nil || appendErr == nil || granted {
				t.Errorf("RequestVote: %v (granted %v), AppendEntries: %v; want both refused", voteErr, granted, appendErr)
			}
			if got := r.Term(); got != before || !r.IsLeader() {
				t.Errorf("term %d (leader %v) after the attack, was %d (leader)", got, r.IsLeader(), before)
			}
		})
	}
	// A replica certificate of the run's CA is accepted: the same RPCs
	// reach Raft (the check above refuses by certificate, not by accident).
	t.Run("replica certificate reaches Raft", func(t *testing.T) {
		before := r.Term()
		_, appendErr, _ := attack(t, r, client(keyPair("r2")))
		if appendErr != nil {
			t.Fatalf("AppendEntries: %v", appendErr)
		}
		if got := r.Term(); got <= before {
			t.Fatalf("term %d, was %d: a replica's RPC did not reach Raft", got, before)
		}
	})
}

// TestRaftDialRefusesNonReplica: a replica dialing an address where a
// node's certificate answers refuses the connection.
func TestRaftDialRefusesNonReplica(t *testing.T) {
	dir := testPKI(t)
	node, err := tls.LoadX509KeyPair(filepath.Join(dir, "node-0.crt"), filepath.Join(dir, "node-0.key"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{node}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	s, err := raftnet.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := raftnet.NewTLSStream(s, loadTLS(t, dir, "r1"), slog.New(slog.DiscardHandler))
	defer ts.Close()
	if c, err := ts.Dial(raft.ServerAddress(l.Addr().String()), 5*time.Second); err == nil {
		c.Close()
		t.Fatal("Dial accepted a node's certificate as a replica")
	}
}

func TestReplicaConfigTLS(t *testing.T) {
	dir := testPKI(t)
	other := loadTLS(t, dir, "r1")
	other.Cert = otherCACert(t, "r1")
	for _, tc := range []struct {
		name string
		tls  *raftnet.TLS
		ok   bool
	}{
		{"own replica certificate", loadTLS(t, dir, "r1"), true},
		{"another replica's certificate", loadTLS(t, dir, "r2"), false},
		{"node certificate", loadTLS(t, dir, "node-0"), false},
		{"observer certificate", loadTLS(t, dir, "ops"), false},
		{"another CA", other, false},
		{"no certificate", &raftnet.TLS{CAs: other.CAs}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testReplicaConfig(t.TempDir(), "127.0.0.1:0")
			cfg.TLS = tc.tls
			err := cfg.Validate()
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrReplicaCert) {
				t.Fatalf("Validate: %v, want ErrReplicaCert", err)
			}
			if _, err := OpenReplica(cfg, testInit); !errors.Is(err, ErrReplicaCert) {
				t.Fatalf("OpenReplica: %v, want ErrReplicaCert", err)
			}
		})
	}
}

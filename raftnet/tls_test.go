package raftnet

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/pki"
)

// certs writes a run's CA and certificates for replicas r1 and r2 and node
// node-0 into a temporary directory and returns a loader of one of them.
func certs(t *testing.T) func(id string) *TLS {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	names := []pki.Name{{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleReplica, ID: "r2"}, {Role: pki.RoleNode, ID: "node-0"}}
	if _, err := pki.Init(dir, names, nil, 1); err != nil {
		t.Fatal(err)
	}
	return func(id string) *TLS {
		rt, err := LoadTLS(filepath.Join(dir, pki.CACertFile), filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
}

// TestTLSCheck: a replica's own certificate passes Check for its ID;
// another replica's and a node's are refused with ErrReplicaCert.
func TestTLSCheck(t *testing.T) {
	load := certs(t)
	if err := load("r1").Check("r1"); err != nil {
		t.Fatalf("own certificate: %v", err)
	}
	for _, c := range []struct{ cert, id string }{{"r2", "r1"}, {"node-0", "node-0"}} {
		if err := load(c.cert).Check(c.id); !errors.Is(err, ErrReplicaCert) {
			t.Fatalf("%s's certificate for %s: %v, want ErrReplicaCert", c.cert, c.id, err)
		}
	}
}

// TestTLSStreamCheckPeer: dialing a TLS stream, CheckPeer accepts the ID
// of the replica certificate it presents and refuses any other with
// ErrPeerIdentity.
func TestTLSStreamCheckPeer(t *testing.T) {
	load := certs(t)
	log := slog.New(slog.DiscardHandler)
	streams := make([]*TLSStream, 2)
	for i, id := range []string{"r1", "r2"} {
		s, err := Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = NewTLSStream(s, load(id), log)
		defer streams[i].Close()
	}
	// The peer's accept loop must hand the connection to someone.
	go func() {
		for {
			c, err := streams[1].Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := streams[1].Addr().String()
	if err := streams[0].CheckPeer(ctx, addr, "r2"); err != nil {
		t.Fatalf("CheckPeer of r2 at r2's address: %v", err)
	}
	if err := streams[0].CheckPeer(ctx, addr, "r3"); !errors.Is(err, ErrPeerIdentity) {
		t.Fatalf("CheckPeer of r3 at r2's address: %v, want ErrPeerIdentity", err)
	}
}

// TestTLSStreamCloseAbortsHandshakes: Close returns at once even with a
// connection that never sends its handshake, and ends every goroutine (it
// waits for them).
func TestTLSStreamCloseAbortsHandshakes(t *testing.T) {
	load := certs(t)
	s, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := NewTLSStream(s, load("r1"), slog.New(slog.DiscardHandler))
	c, err := net.Dial("tcp", ts.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(50 * time.Millisecond) // let the handshake start
	done := make(chan error, 1)
	go func() { done <- ts.Close() }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Close blocked on a silent connection's handshake")
	}
	if _, err := ts.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

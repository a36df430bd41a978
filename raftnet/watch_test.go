package raftnet

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestWatchedStreamReportsEnds: the end of an accepted connection, closed
// by its peer, is reported on Ended once; a live one is not.
func TestWatchedStreamReportsEnds(t *testing.T) {
	s, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := Watch(s)
	defer w.Close()
	dial := func() (client, server net.Conn) {
		t.Helper()
		c, err := w.Dial(raft.ServerAddress(w.Addr().String()), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		a, err := w.Accept()
		if err != nil {
			t.Fatal(err)
		}
		go func() { // Raft's handler: read until the connection ends
			buf := make([]byte, 64)
			for {
				if _, err := a.Read(buf); err != nil {
					return
				}
			}
		}()
		return c, a
	}
	live, _ := dial()
	defer live.Close()
	if _, err := live.Write([]byte("heartbeat")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Ended():
		t.Fatal("a live connection was reported as ended")
	case <-time.After(50 * time.Millisecond):
	}
	dead, _ := dial()
	dead.Close()
	select {
	case <-w.Ended():
	case <-time.After(5 * time.Second):
		t.Fatal("the end of a connection its peer closed was not reported")
	}
}

// TestRefused: a port nobody listens on refuses; a listening one, or a
// malformed address, does not.
func TestRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if Refused(addr, time.Second) {
		t.Errorf("%s listens, and was reported as refusing", addr)
	}
	l.Close()
	if !Refused(addr, time.Second) {
		t.Errorf("%s has no listener, and was not reported as refusing", addr)
	}
	if Refused("not an address", 50*time.Millisecond) {
		t.Error("a malformed address was reported as refusing")
	}
}

// TestDialWaitsForARestartingPeer: a dial to a port that refuses is tried
// again until a listener comes up there (a replica restarting), within the
// dial's timeout; EndRetries ends a dial's retries at once.
func TestDialWaitsForARestartingPeer(t *testing.T) {
	s, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // the peer is down
	up := make(chan net.Listener, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the peer restarts
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
		}
		up <- l
	}()
	c, err := s.Dial(raft.ServerAddress(addr), 10*time.Second)
	if err != nil {
		t.Fatalf("dial to a peer that came back: %v", err)
	}
	c.Close()
	(<-up).Close()

	done := make(chan error, 1)
	go func() {
		_, err := s.Dial(raft.ServerAddress(addr), time.Minute) // down for good
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	s.EndRetries()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a dial to a port nobody listens on succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("EndRetries did not end the retries of a dial in progress")
	}
}

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

package raftnet

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// WatchedStream is a stream layer that reports the end of the connections
// it accepted: a follower's inbound Raft connections come from the leader
// (AppendEntries, heartbeats, snapshots) and from candidates, so the end
// of one is the first sign, well before a heartbeat timeout, that a
// leader's process may have died. The coordinator's leader watch
// (coordinator/leaderwatch.go) acts on it only with proof: the leader
// silent and its address refusing connections (Refused).
type WatchedStream struct {
	raft.StreamLayer
	ended chan struct{}
}

// Watch wraps layer.
func Watch(layer raft.StreamLayer) *WatchedStream {
	return &WatchedStream{StreamLayer: layer, ended: make(chan struct{}, 1)}
}

// Accept implements net.Listener: the connection reports its end (the
// first failed Read: the peer closed it, it was reset, or this side
// closed it) on Ended.
func (w *WatchedStream) Accept() (net.Conn, error) {
	c, err := w.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, ended: w.ended}, nil
}

// Ended receives a value after an accepted connection ended; ends that
// come while one is pending are merged into it.
func (w *WatchedStream) Ended() <-chan struct{} { return w.ended }

type watchedConn struct {
	net.Conn
	ended chan struct{}
	once  sync.Once
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(func() {
			select {
			case c.ended <- struct{}{}:
			default:
			}
		})
	}
	return n, err
}

// Refused reports whether a TCP connection to addr is refused within
// timeout: no process listens there (its host answered that the port is
// closed). A timeout, an unreachable host or an accepted connection are
// not refusals: a silent partition, or a proxy in between, proves nothing
// about the process behind it. A firewall that rejects with a reset does
// look like a refusal (the peer is unreachable from here either way).
func Refused(addr string, timeout time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

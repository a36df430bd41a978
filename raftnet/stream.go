package raftnet

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// Stream is Raft's TCP stream layer (raft.StreamLayer). Unlike raft's own TCP transport,
// it advertises the address exactly as configured (a DNS name stays a
// name, so a replica whose container comes back with a new IP keeps the
// address its peers know), except that a port of 0 advertises the port
// the listener got.
type Stream struct {
	net.Listener
	advertise raftAddr

	closed    chan struct{} // closed by Close: ends the dials' retries
	closeOnce sync.Once
}

type raftAddr string

func (a raftAddr) Network() string { return "tcp" }
func (a raftAddr) String() string  { return string(a) }

// Listen listens for Raft connections on addr (host:port; port 0 picks a
// free one, which the stream then advertises).
func Listen(addr string) (*Stream, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	adv := addr
	if port == "0" {
		adv = net.JoinHostPort(host, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return &Stream{Listener: l, advertise: raftAddr(adv), closed: make(chan struct{})}, nil
}

// Dial implements raft.StreamLayer: a TCP connection to address within
// timeout (dialTCP).
func (s *Stream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.dialTCP(string(address), time.Now().Add(timeout))
}

// dialRetry is how often a refused dial is tried again.
const dialRetry = 10 * time.Millisecond

// dialTCP connects to addr before deadline. A refused connection (no
// process listens there: a replica restarting) is tried again every
// dialRetry until the deadline or Close, so that a peer is reached the
// moment it listens again. Raft needs this: hashicorp/raft's replication
// to a follower backs off after each failed RPC without a cap (10 ms
// doubling, up to 10 s after 12 failures; replication.go), and refusals
// come as fast as it asks, so a replica down for half a second was
// otherwise sent nothing for up to another half second after it came
// back, and a failover in that window waited for it (docs/RELIABILITY.md).
// With the retry here a down peer costs one failed RPC per dial timeout.
func (s *Stream) dialTCP(addr string, deadline time.Time) (net.Conn, error) {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Until(deadline) <= dialRetry {
			return c, err
		}
		select {
		case <-s.closed:
			return nil, err
		case <-time.After(dialRetry):
		}
	}
}

// EndRetries ends the retries of refused dials, those in progress and
// later ones (a dial then fails at its first refusal). Raft's Shutdown
// waits for its goroutines before it closes the transport, so a replica
// shutting down calls this first.
func (s *Stream) EndRetries() { s.closeOnce.Do(func() { close(s.closed) }) }

// Close implements net.Listener: it closes the listener and ends the
// retries of dials (EndRetries).
func (s *Stream) Close() error {
	s.EndRetries()
	return s.Listener.Close()
}

// Addr implements net.Listener: the advertised address.
func (s *Stream) Addr() net.Addr { return s.advertise }

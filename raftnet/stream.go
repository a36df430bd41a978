package raftnet

import (
	"net"
	"strconv"
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
	return &Stream{Listener: l, advertise: raftAddr(adv)}, nil
}

// Dial implements raft.StreamLayer.
func (s *Stream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}

// Addr implements net.Listener: the advertised address.
func (s *Stream) Addr() net.Addr { return s.advertise }

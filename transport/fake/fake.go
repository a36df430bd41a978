// Package fake is an in-memory transport.Link with fault injection, for
// tests of code that talks over transport.Conn. Every message goes through
// the real codec (the transport.Client on top encodes and decodes it); the
// fake only moves bytes, and can drop, delay, duplicate, reorder, corrupt
// them, emulate a slow consumer, or partition links from each other.
//
//	net := fake.NewNetwork(1, fake.Options{})
//	a, _ := transport.NewClient(net.Link("coordinator"), cfg, nil)
//	b, _ := transport.NewClient(net.Link("node-1"), cfg, nil)
//	net.SetFaults(fake.Faults{Drop: 0.1, Reorder: 0.2})
//
// Randomness comes from the seed given to NewNetwork, so a failing run
// replays (up to goroutine scheduling).
package fake

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrClosed is returned by operations on a closed Link.
var ErrClosed = errors.New("fake: link closed")

// Options configure a Network.
type Options struct {
	// MaxPayload is the largest message a link carries (default 1 MiB,
	// like NATS).
	MaxPayload int
}

// Faults are applied independently to each delivery (one message to one
// subscriber). Probabilities are in [0, 1].
type Faults struct {
	Drop      float64       // lose the delivery
	Duplicate float64       // deliver twice
	Reorder   float64       // deliver before up to 8 messages queued ahead of it
	Corrupt   float64       // flip one random bit
	Delay     time.Duration // add a uniform random delay in [0, Delay]
	// QueueLimit, if > 0, is the number of deliveries a subscriber may have
	// queued; further ones are dropped, like a NATS slow consumer.
	QueueLimit int
	// Filter, if not nil, sees every delivery (the sending link's name, the
	// subject and the bytes, which it must not modify) and drops it by
	// returning false. It runs under the network's lock: keep it short and
	// do not call the network from it.
	Filter func(from, subject string, data []byte) bool
}

// Network connects the links made from it. It is safe for concurrent use.
type Network struct {
	maxPayload int

	mu        sync.Mutex
	rng       *rand.Rand
	faults    Faults
	subs      map[string][]*sub // by literal subject
	wild      []*sub            // subscriptions with wildcards, in order
	partition map[[2]string]bool
	stats     Stats
}

// Stats counts what the network did to deliveries.
type Stats struct {
	Delivered, Dropped, Duplicated, Reordered, Corrupted, Partitioned, Overflowed uint64
}

// NewNetwork returns an empty network whose faults draw from a PCG seeded
// with seed.
func NewNetwork(seed uint64, opts Options) *Network {
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = 1 << 20
	}
	return &Network{
		maxPayload: opts.MaxPayload,
		rng:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		subs:       make(map[string][]*sub),
		partition:  make(map[[2]string]bool),
	}
}

// SetFaults replaces the faults applied to future deliveries.
func (n *Network) SetFaults(f Faults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = f
}

// Partition cuts links a and b (by name) from each other in both
// directions until Heal.
func (n *Network) Partition(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.partition[[2]string{a, b}] = true
	n.partition[[2]string{b, a}] = true
}

// Heal removes every partition.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.partition)
}

// Stats returns a snapshot of the network's counters.
func (n *Network) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Link returns a new link named name (names are used by Partition and
// Filter; several links may share one).
func (n *Network) Link(name string) *Link {
	return &Link{net: n, name: name}
}

// Link is one client's attachment to a Network. It implements
// transport.Link.
type Link struct {
	net  *Network
	name string

	mu     sync.Mutex
	closed bool
	subs   []*sub
}

type delivery struct {
	subject string
	data    []byte
	at      time.Time
}

// sub is one subscription: a queue drained by its own goroutine.
type sub struct {
	link    *Link
	subject string
	fn      func(string, []byte)

	mu     sync.Mutex
	cond   *sync.Cond
	queue  []delivery
	stop   bool
	stopCh chan struct{} // closed when stop is set
	done   chan struct{}
}

// Publish copies data to every subscriber of subject (those of the
// literal subject first, then those whose wildcard pattern matches it, in
// subscription order), applying faults.
func (l *Link) Publish(subject string, data []byte) error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if len(data) > l.net.maxPayload {
		return errors.New("fake: maximum payload exceeded")
	}
	n := l.net
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.faults
	now := time.Now()
	targets := n.subs[subject]
	for _, s := range n.wild {
		if Match(s.subject, subject) {
			targets = append(targets[:len(targets):len(targets)], s)
		}
	}
	for _, s := range targets {
		if n.partition[[2]string{l.name, s.link.name}] {
			n.stats.Partitioned++
			continue
		}
		if f.Filter != nil && !f.Filter(l.name, subject, data) {
			n.stats.Dropped++
			continue
		}
		if n.rng.Float64() < f.Drop {
			n.stats.Dropped++
			continue
		}
		copies := 1
		if n.rng.Float64() < f.Duplicate {
			copies = 2
			n.stats.Duplicated++
		}
		for range copies {
			d := delivery{subject: subject, data: append([]byte(nil), data...), at: now}
			if n.rng.Float64() < f.Corrupt && len(d.data) > 0 {
				i := n.rng.IntN(len(d.data))
				d.data[i] ^= 1 << n.rng.IntN(8)
				n.stats.Corrupted++
			}
			if f.Delay > 0 {
				d.at = now.Add(time.Duration(n.rng.Int64N(int64(f.Delay) + 1)))
			}
			back := 0
			if n.rng.Float64() < f.Reorder {
				back = 1 + n.rng.IntN(8)
				n.stats.Reordered++
			}
			if s.push(d, back, f.QueueLimit) {
				n.stats.Delivered++
			} else {
				n.stats.Overflowed++
			}
		}
	}
	return nil
}

// push queues d, back places ahead of the tail. It reports false if the
// queue is full or the subscription stopped.
func (s *sub) push(d delivery, back, limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop || (limit > 0 && len(s.queue) >= limit) {
		return false
	}
	i := max(len(s.queue)-back, 0)
	s.queue = append(s.queue, delivery{})
	copy(s.queue[i+1:], s.queue[i:])
	s.queue[i] = d
	s.cond.Signal()
	return true
}

func (s *sub) run() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.stop {
			s.cond.Wait()
		}
		if s.stop {
			s.mu.Unlock()
			return
		}
		d := s.queue[0]
		s.queue[0] = delivery{}
		s.queue = s.queue[1:]
		s.mu.Unlock()
		if wait := time.Until(d.at); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.stopCh:
				t.Stop()
				return
			}
		}
		s.fn(d.subject, d.data)
	}
}

func (s *sub) halt() {
	s.mu.Lock()
	if !s.stop {
		close(s.stopCh)
	}
	s.stop = true
	s.queue = nil
	s.cond.Broadcast()
	s.mu.Unlock()
}

// Subscribe implements transport.Link. subject may hold the NATS
// wildcards (see Match). fn runs on the subscription's own goroutine, one
// delivery at a time. The fake enforces no permissions.
func (l *Link) Subscribe(subject string, fn func(string, []byte)) (func() error, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	s := &sub{link: l, subject: subject, fn: fn, stopCh: make(chan struct{}), done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	l.subs = append(l.subs, s)
	n := l.net
	n.mu.Lock()
	if wildcard(subject) {
		n.wild = append(n.wild, s)
	} else {
		n.subs[subject] = append(n.subs[subject], s)
	}
	n.mu.Unlock()
	go s.run()
	return func() error { l.unsubscribe(s); return nil }, nil
}

// unsubscribe removes s from the network and stops its goroutine without
// waiting (it may be called from s's own callback); Close waits.
func (l *Link) unsubscribe(s *sub) {
	n := l.net
	n.mu.Lock()
	if wildcard(s.subject) {
		n.wild = slices.DeleteFunc(n.wild, func(x *sub) bool { return x == s })
	} else {
		list := n.subs[s.subject]
		for i, x := range list {
			if x == s {
				n.subs[s.subject] = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(n.subs[s.subject]) == 0 {
			delete(n.subs, s.subject)
		}
	}
	n.mu.Unlock()
	s.halt()
}

// Flush implements transport.Link. Publish queues synchronously, so there
// is nothing to wait for.
func (l *Link) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	return nil
}

// MaxPayload implements transport.Link.
func (l *Link) MaxPayload() int { return l.net.maxPayload }

// Close unsubscribes everything and waits for the link's goroutines. It must
// not be called from a subscription callback.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	subs := l.subs
	l.subs = nil
	l.mu.Unlock()
	for _, s := range subs {
		l.unsubscribe(s)
		<-s.done
	}
	return nil
}

// Match reports whether subject matches the NATS subject pattern: tokens
// are separated by dots, "*" matches any one token and ">", as the last
// token, one or more tokens.
func Match(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">" && i == len(p)-1:
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}

func wildcard(subject string) bool {
	for _, tok := range strings.Split(subject, ".") {
		if tok == "*" || tok == ">" {
			return true
		}
	}
	return false
}

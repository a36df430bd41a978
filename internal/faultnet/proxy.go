// Package faultnet is a TCP proxy that injects network faults between
// processes, for the process-level soak (e2e): put a Proxy in
// front of a listening port, point the other processes at the proxy's
// address, and cut, delay or half-open the connections through it while
// they run.
//
//	p, err := faultnet.Listen("127.0.0.1:0", "127.0.0.1:7000")
//	...
//	p.Cut()                       // close every connection, refuse new ones
//	p.Heal()                      // forward again
//	p.Delay(50 * time.Millisecond) // add latency to every chunk, both ways
//	p.HalfOpen(faultnet.Upstream) // keep connections open, forward nothing client→target
//	p.Close()                     // stop; waits for every goroutine
//
// The faults, as the peers see them:
//
//   - Cut: every connection through the proxy is closed at once (with a
//     TCP reset) and a new one is accepted and closed at once, so a dial
//     succeeds but the first read fails, until Heal.
//   - Delay(d): each chunk read from one side is held d before it is
//     written to the other; the chunks of a direction are forwarded in
//     order, one at a time, so a delay also bounds a direction's
//     throughput (one chunk of at most 32 KiB per d).
//   - HalfOpen(dir): the connections stay open and new ones are accepted
//     and dialed, but nothing is forwarded in dir: the proxy stops reading
//     that side, so the sender's kernel buffers fill and its writes block,
//     as when a link drops every packet without a reset. On Heal what was
//     held is delivered, as TCP retransmission would deliver it on a link
//     that comes back before the sender gives up.
//
// Faults combine (a delayed half-open link delivers late after Heal) and
// Heal clears them all. A Proxy is safe for concurrent use. It owns one
// accept goroutine and, per connection, two forwarding goroutines; Close
// closes the listener and every connection and waits for all of them.
package faultnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Direction names which way data flows through a connection.
type Direction int

const (
	// Upstream is from the client that dialed the proxy to the target.
	Upstream Direction = 1 << iota
	// Downstream is from the target back to the client.
	Downstream
	// Both is Upstream and Downstream.
	Both = Upstream | Downstream
)

func (d Direction) String() string {
	switch d {
	case Upstream:
		return "upstream"
	case Downstream:
		return "downstream"
	case Both:
		return "both"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// ErrClosed is returned by Close when the proxy was already closed.
var ErrClosed = errors.New("faultnet: proxy closed")

// dialTimeout bounds the proxy's dial of its target for one connection.
const dialTimeout = 5 * time.Second

// chunkSize is the most a forwarding goroutine reads at once.
const chunkSize = 32 << 10

// Proxy forwards every TCP connection made to its address to the target,
// injecting the faults set by Cut, Delay and HalfOpen until Heal.
type Proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // the accept goroutine and every link's goroutines

	mu      sync.Mutex
	cut     bool
	delay   time.Duration
	halted  Direction
	changed chan struct{} // closed and replaced when halted changes
	links   map[*link]struct{}
	closed  bool
	stats   Stats
}

// Stats counts a proxy's connections.
type Stats struct {
	Accepted int // connections accepted and forwarded
	Refused  int // connections accepted and closed at once (cut, or the target refused)
	Cut      int // open connections closed by Cut
}

// Listen starts a proxy listening on addr (host:port; port 0 picks one)
// that forwards each connection to target.
func Listen(addr, target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultnet: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultnet: %w", err)
	}
	p := &Proxy{ln: ln, target: target, changed: make(chan struct{}), links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address the proxy listens on (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Cut closes every open connection and closes each new one at once until
// Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	links := p.takeLinks()
	p.stats.Cut += len(links)
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
}

// Delay holds every chunk d before forwarding it, in both directions, until
// Heal (or another Delay). Delay(0) removes the delay.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.mu.Unlock()
}

// HalfOpen stops forwarding in dir, keeping connections open, until Heal.
// Calls add up: HalfOpen(Upstream) then HalfOpen(Downstream) halts both.
func (p *Proxy) HalfOpen(dir Direction) {
	p.mu.Lock()
	p.setHalted(p.halted | dir&Both)
	p.mu.Unlock()
}

// Heal clears every fault: new connections are forwarded again, the
// delay is removed and halted directions resume.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut, p.delay = false, 0
	p.setHalted(0)
	p.mu.Unlock()
}

// Conns returns how many connections are open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Stats returns the proxy's connection counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops the proxy: it closes the listener and every connection and
// returns once every goroutine of the proxy has exited. It returns
// ErrClosed if the proxy was already closed.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	links := p.takeLinks()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close(false)
	}
	p.wg.Wait()
	return err
}

// setHalted sets the halted directions and wakes the forwarding
// goroutines waiting for a change. p.mu must be held.
func (p *Proxy) setHalted(d Direction) {
	if d == p.halted {
		return
	}
	p.halted = d
	close(p.changed)
	p.changed = make(chan struct{})
}

// takeLinks removes and returns every open link. p.mu must be held.
func (p *Proxy) takeLinks() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
		delete(p.links, l)
	}
	return links
}

// accept runs until the listener is closed (by Close).
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.mu.Lock()
		if p.closed || p.cut {
			p.stats.Refused++
			p.mu.Unlock()
			reset(c)
			continue
		}
		l := newLink(c)
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// serve dials the target for l and forwards both directions until either
// ends or the link is closed; it owns l's forwarding goroutines.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.DialContext(l.ctx, "tcp", p.target)
	if err != nil {
		p.mu.Lock()
		p.stats.Refused++
		delete(p.links, l)
		p.mu.Unlock()
		l.close(true)
		return
	}
	if !l.setTarget(up) {
		up.Close() // closed (cut or Close) while dialing
		return
	}
	p.mu.Lock()
	p.stats.Accepted++
	p.mu.Unlock()
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); p.pump(l, Upstream, l.client, up) }()
	go func() { defer pumps.Done(); p.pump(l, Downstream, up, l.client) }()
	pumps.Wait()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.close(false)
}

// pump copies src to dst in dir until either fails or l is closed, then
// closes l (a connection through the proxy ends as a whole).
func (p *Proxy) pump(l *link, dir Direction, src, dst net.Conn) {
	defer l.close(false)
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold(l, dir) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold blocks while dir is halted, then for the delay; it returns false
// if l was closed meanwhile.
func (p *Proxy) hold(l *link, dir Direction) bool {
	for {
		p.mu.Lock()
		halted, changed, delay := p.halted&dir != 0, p.changed, p.delay
		p.mu.Unlock()
		if !halted {
			if delay == 0 {
				return true
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				return true
			case <-l.ctx.Done():
				t.Stop()
				return false
			}
		}
		select {
		case <-changed:
		case <-l.ctx.Done():
			return false
		}
	}
}

// link is one client connection and its connection to the target.
type link struct {
	client net.Conn
	ctx    context.Context // done once close was called
	cancel context.CancelFunc

	mu     sync.Mutex
	target net.Conn // nil until dialed
	closed bool
}

func newLink(client net.Conn) *link {
	ctx, cancel := context.WithCancel(context.Background())
	return &link{client: client, ctx: ctx, cancel: cancel}
}

// setTarget records the dialed target connection; false if the link was
// closed first.
func (l *link) setTarget(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.target = c
	return true
}

// close closes both connections (with a reset if abort) and cancels
// l.ctx; it is idempotent.
func (l *link) close(abort bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	l.cancel()
	for _, c := range []net.Conn{l.client, l.target} {
		if c == nil {
			continue
		}
		if abort {
			reset(c)
		} else {
			c.Close()
		}
	}
}

// reset closes c with a TCP reset rather than a FIN, as a broken link or a
// refusing host would.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

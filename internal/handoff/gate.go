// Package handoff hands messages from transport handlers to the one loop
// goroutine that owns a protocol's state (node.Worker's run loop,
// coordinator.Server's loop). The handlers run on goroutines the
// transport owns; they only forward. A Gate makes every handler call
// return promptly once the loop is gone, and lets the loop wait for the
// calls still in progress:
//
//	func (in *myInbox) deliver(m transport.Message) {
//		if !in.gate.Enter() {
//			return // the loop has stopped
//		}
//		defer in.gate.Leave()
//		handoff.Send(in.gate, in.msgs, m)
//	}
//
// and the loop's owner calls gate.Close() when the loop returns.
package handoff

import "sync"

// Gate tracks the handler calls that forward to one loop. It is safe for
// concurrent use.
type Gate struct {
	stop chan struct{}

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
}

// NewGate returns an open Gate.
func NewGate() *Gate { return &Gate{stop: make(chan struct{})} }

// Enter registers a handler call. It returns false once the Gate is
// closed: the call must then return without forwarding. Every Enter that
// returns true must be paired with one Leave.
func (g *Gate) Enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.inflight.Add(1)
	return true
}

// Leave ends a call registered by Enter.
func (g *Gate) Leave() { g.inflight.Done() }

// Send delivers v on ch, blocking while ch is full (back-pressure on the
// caller, a transport subscription), and gives up when g closes.
func Send[T any](g *Gate, ch chan<- T, v T) {
	select {
	case ch <- v:
	case <-g.stop:
	}
}

// Close makes every Send return, refuses later Enters, and waits for the
// calls in progress to Leave. It may be called more than once.
func (g *Gate) Close() {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.stop)
	}
	g.mu.Unlock()
	g.inflight.Wait()
}

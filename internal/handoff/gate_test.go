package handoff

import (
	"sync"
	"testing"
	"time"
)

// TestCloseReleasesBlockedSends: handlers blocked on a full channel return
// when the Gate closes; Close waits for them, and later calls do not
// enter.
func TestCloseReleasesBlockedSends(t *testing.T) {
	g := NewGate()
	ch := make(chan int) // never read: every Send blocks
	var returned sync.WaitGroup
	for i := range 4 {
		if !g.Enter() {
			t.Fatal("Enter refused on an open gate")
		}
		returned.Add(1)
		go func() {
			defer returned.Done()
			defer g.Leave()
			Send(g, ch, i)
		}()
	}
	done := make(chan struct{})
	go func() {
		g.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return: blocked Sends were not released")
	}
	returned.Wait() // Close returned, so every call has left
	if g.Enter() {
		t.Fatal("Enter accepted after Close")
	}
	g.Close() // idempotent
}

// TestSendDelivers: an open Gate passes values through in order.
func TestSendDelivers(t *testing.T) {
	g := NewGate()
	ch := make(chan int, 3)
	for i := range 3 {
		Send(g, ch, i)
	}
	for want := range 3 {
		if got := <-ch; got != want {
			t.Fatalf("got %d, want %d", got, want)
		}
	}
}

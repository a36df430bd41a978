package handoff_test

import (
	"fmt"
	"sync"

	"github.com/dpcluster/dpcluster/internal/handoff"
)

// Handlers on other goroutines forward to a loop through a Gate; once the
// loop's owner closes the Gate, a handler returns at once instead of
// blocking on a channel nobody reads.
func Example() {
	gate := handoff.NewGate()
	msgs := make(chan int, 1)
	deliver := func(m int) bool {
		if !gate.Enter() {
			return false // the loop has stopped
		}
		defer gate.Leave()
		handoff.Send(gate, msgs, m)
		return true
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the loop: takes two messages, then stops
		defer wg.Done()
		for range 2 {
			fmt.Println("loop got", <-msgs)
		}
	}()
	deliver(1)
	deliver(2)
	wg.Wait()
	deliver(3)      // fills the buffer
	go gate.Close() // the loop is gone: a blocked Send gives up
	deliver(4)
	fmt.Println("after Close, delivered:", deliver(5))
	// Output:
	// loop got 1
	// loop got 2
	// after Close, delivered: false
}

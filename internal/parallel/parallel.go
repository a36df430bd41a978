// Package parallel runs loops over long vectors on several cores with a
// result that does not depend on how many: the range is cut into chunks of
// a fixed size, whatever GOMAXPROCS is, and a caller that combines
// per-chunk results does so in chunk order. Elementwise work (each index
// written by one call) is then bit-identical to the serial loop, and a
// reduction is the same bits on every machine.
package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Chunks calls fn(c, lo, hi) once for each chunk c of [0, n): [c·size,
// min((c+1)·size, n)). Chunks run on up to GOMAXPROCS goroutines, which
// have all returned when Chunks does; a single chunk runs on the calling
// goroutine. fn must write only to state of its own chunk.
func Chunks(n, size int, fn func(c, lo, hi int)) {
	if n <= 0 {
		return
	}
	chunks := (n + size - 1) / size
	if chunks == 1 {
		fn(0, 0, n)
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), chunks) {
		wg.Go(func() {
			for {
				c := int(next.Add(1) - 1)
				if c >= chunks {
					return
				}
				lo := c * size
				fn(c, lo, min(lo+size, n))
			}
		})
	}
	wg.Wait()
}

// Count returns the number of chunks of size in [0, n).
func Count(n, size int) int {
	if n <= 0 {
		return 0
	}
	return (n + size - 1) / size
}

package parallel

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// TestChunks: every index is visited exactly once, by the chunk Count and
// the chunk size say, whatever GOMAXPROCS is.
func TestChunks(t *testing.T) {
	for _, procs := range []int{1, 3, 8} {
		prev := runtime.GOMAXPROCS(procs)
		for _, c := range []struct{ n, size int }{{0, 4}, {1, 4}, {4, 4}, {5, 4}, {1000, 7}, {1 << 16, 1 << 10}} {
			seen := make([]atomic.Int32, c.n)
			calls := make([]atomic.Int32, Count(c.n, c.size))
			Chunks(c.n, c.size, func(k, lo, hi int) {
				calls[k].Add(1)
				if lo != k*c.size || hi != min(lo+c.size, c.n) {
					t.Errorf("n %d size %d: chunk %d is [%d, %d)", c.n, c.size, k, lo, hi)
				}
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
			})
			for i := range seen {
				if seen[i].Load() != 1 {
					t.Fatalf("GOMAXPROCS %d, n %d size %d: index %d visited %d times", procs, c.n, c.size, i, seen[i].Load())
				}
			}
			for k := range calls {
				if calls[k].Load() != 1 {
					t.Fatalf("chunk %d called %d times", k, calls[k].Load())
				}
			}
		}
		runtime.GOMAXPROCS(prev)
	}
}

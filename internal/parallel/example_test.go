package parallel_test

import (
	"fmt"

	"github.com/dpcluster/dpcluster/internal/parallel"
)

// A sum over a long vector: per-chunk partial sums on as many cores as
// there are, combined in chunk order, so the bits are those of any other
// machine's run.
func Example() {
	x := make([]float32, 10_000)
	for i := range x {
		x[i] = 1 / float32(i+1)
	}
	const size = 4096
	partial := make([]float32, parallel.Count(len(x), size))
	parallel.Chunks(len(x), size, func(c, lo, hi int) {
		for _, v := range x[lo:hi] {
			partial[c] += v
		}
	})
	var sum float32
	for _, p := range partial {
		sum += p
	}
	fmt.Println(len(partial), "chunks, sum", sum)
	// Output: 3 chunks, sum 9.78761
}

package accounting

import (
	"math"
	"testing"
)

// TestPLDWideBucketAtItsTop: a count that is its bucket's top (a power of
// two, which StepLimit's search tries) in a bucket whose counts need
// windows of their own got the bucket's marker instead of a prepared
// composition, an empty window, and a panic in the FFT; a local run with
// a large target ε crashed in the ledger's step-limit search. The count
// must get its own window, and an ε no smaller than the same count's
// neighbour below.
func TestPLDWideBucketAtItsTop(t *testing.T) {
	for _, count := range []int64{1 << 40, 1 << 30, 1 << 20} {
		e := PLDEvent{SampleRate: 0.185, NoiseMultiplier: 0.87, Count: count}
		eps, err := PLD{}.EpsilonSteps([]PLDEvent{e}, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		e.Count--
		below, err := PLD{}.EpsilonSteps([]PLDEvent{e}, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		if math.IsNaN(eps) || eps < below {
			t.Errorf("count %d: ε %v, below it %v", count, eps, below)
		}
	}
}

package accounting

import (
	"math"
	"testing"
)

// TestPLDWideBucketTopRobust: a count that is its bucket's top (a power
// of two, which StepLimit's search tries, e.g. for a large target ε) in a
// bucket whose counts need windows of their own gets a prepared window of
// its own, not the bucket's wide marker (whose window is empty), and an ε
// no smaller than its neighbour's below. Seconds of FFTs on the largest
// windows: .ci/run runs it without -race, with the other sweeps.
func TestPLDWideBucketTopRobust(t *testing.T) {
	if raceEnabled {
		t.Skip("numeric, no concurrency: .ci/run runs it without -race (\"accounting sweeps\")")
	}
	e := PLDEvent{SampleRate: 0.5, NoiseMultiplier: 0.87, Count: 1 << 18}
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
		t.Errorf("ε %v at 2^18 steps, %v at one fewer", eps, below)
	}
}

package privacyaudit

import (
	"errors"
	"testing"
)

var reachSplits = []Split{{KPlus: 10}, {KPlus: 50}, {KPlus: 100, KMinus: 100}, {KPlus: 250, KMinus: 250}}

// With q = 1 and σ small every canary's shift 1/σ per step dwarfs the
// noise: the ideal audit guesses every canary right and reaches the
// ceiling in every repetition.
func TestIdealReachSeparableReachesCeiling(t *testing.T) {
	p := Ideal{Canaries: 1000, SampleRate: 1, Steps: 10, Sigma: 0.2, Delta: 1e-5, Beta: 0.05, Splits: reachSplits}
	r, err := IdealReach(p, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ceiling < 4 {
		t.Fatalf("ceiling %v, want above 4 for m = 1000", r.Ceiling)
	}
	if r.P10 != r.Ceiling || r.Median != r.Ceiling || r.P90 != r.Ceiling {
		t.Fatalf("reach %+v, want every quantile at the ceiling %v", r, r.Ceiling)
	}
	if r.FDPCeiling <= r.Ceiling || r.FDPP10 != r.FDPCeiling || r.FDPMedian != r.FDPCeiling || r.FDPMax != r.FDPCeiling {
		t.Fatalf("reach %+v, want every f-DP quantile at its ceiling, above the (ε, δ) ceiling %v", r, r.Ceiling)
	}
}

// With σ large the canaries' shift is lost in the noise: the ideal audit
// shows (almost) nothing.
func TestIdealReachLargeSigmaNearZero(t *testing.T) {
	p := Ideal{Canaries: 1000, SampleRate: 0.01, Steps: 100, Sigma: 50, Delta: 1e-5, Beta: 0.05, Splits: reachSplits}
	r, err := IdealReach(p, 11, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.P90 > 0.2 {
		t.Fatalf("reach %+v, want the 90%% quantile below 0.2 at σ = 50", r)
	}
	if r.CanariesIncluded < 450 || r.CanariesIncluded > 550 {
		t.Fatalf("mean included %v of 1000, want about 500", r.CanariesIncluded)
	}
}

// The reach is ordered in σ (less noise shows more) and a function of its
// seed.
func TestIdealReachMonotoneAndDeterministic(t *testing.T) {
	p := Ideal{Canaries: 500, SampleRate: 0.1, Steps: 100, Delta: 1e-5, Beta: 0.05,
		Splits: []Split{{KPlus: 5}, {KPlus: 25}, {KPlus: 50, KMinus: 50}, {KPlus: 125, KMinus: 125}}}
	p.Sigma = 0.5
	lo, err := IdealReach(p, 7, 3)
	if err != nil {
		t.Fatal(err)
	}
	again, err := IdealReach(p, 7, 3)
	if err != nil {
		t.Fatal(err)
	}
	if lo != again {
		t.Fatalf("same seed: %+v then %+v", lo, again)
	}
	p.Sigma = 0.25
	hi, err := IdealReach(p, 7, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !(hi.Median > lo.Median) || !(lo.P10 <= lo.Median && lo.Median <= lo.P90) {
		t.Fatalf("σ = 0.5: %+v; σ = 0.25: %+v; want the median larger at σ = 0.25 and ordered quantiles", lo, hi)
	}
}

func TestIdealReachInvalid(t *testing.T) {
	ok := Ideal{Canaries: 100, SampleRate: 0.1, Steps: 10, Sigma: 1, Delta: 1e-5, Beta: 0.05, Splits: []Split{{KPlus: 10}}}
	for name, tc := range map[string]struct {
		mod  func(*Ideal)
		reps int
	}{
		"m 0":       {func(p *Ideal) { p.Canaries = 0 }, 1},
		"T 0":       {func(p *Ideal) { p.Steps = 0 }, 1},
		"reps 0":    {func(*Ideal) {}, 0},
		"q 0":       {func(p *Ideal) { p.SampleRate = 0 }, 1},
		"q > 1":     {func(p *Ideal) { p.SampleRate = 1.5 }, 1},
		"σ 0":       {func(p *Ideal) { p.Sigma = 0 }, 1},
		"too much":  {func(p *Ideal) { p.Steps = 1e7 }, 1},
		"no splits": {func(p *Ideal) { p.Splits = nil }, 1},
		"split > m": {func(p *Ideal) { p.Splits = []Split{{KPlus: 101}} }, 1},
		"bad β":     {func(p *Ideal) { p.Beta = 0 }, 1},
	} {
		p := ok
		tc.mod(&p)
		if _, err := IdealReach(p, tc.reps, 1); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

package privacyaudit

import (
	"errors"
	"math"
	"testing"
)

// TestSubsampledGaussianLLR: the closed form where it is safe to evaluate
// directly, the q = 1 limit (the Gaussian's own ratio, z/σ − 1/(2σ²)), no
// overflow for huge z, and growth with z.
func TestSubsampledGaussianLLR(t *testing.T) {
	for _, c := range []struct{ z, q, sigma float64 }{{0, 0.01, 1}, {3, 0.01, 0.5}, {-2, 0.3, 2}, {1, 0.5, 1}} {
		got := SubsampledGaussianLLR(c.z, c.q, c.sigma)
		want := math.Log(1 - c.q + c.q*math.Exp(c.z/c.sigma-1/(2*c.sigma*c.sigma)))
		if math.Abs(got-want) > 1e-13*max(1, math.Abs(want)) {
			t.Errorf("LLR(%v, %v, %v) = %v, want %v", c.z, c.q, c.sigma, got, want)
		}
	}
	if got, want := SubsampledGaussianLLR(2, 1, 0.5), 2/0.5-2.0; math.Abs(got-want) > 1e-14 {
		t.Errorf("q = 1: %v, want %v", got, want)
	}
	if got := SubsampledGaussianLLR(1e6, 1e-3, 0.5); math.IsInf(got, 0) || math.IsNaN(got) || got < 1e6 {
		t.Errorf("z = 1e6: %v, want finite and above 1e6", got)
	}
	prev := math.Inf(-1)
	for z := -10.0; z <= 10; z += 0.5 {
		got := SubsampledGaussianLLR(z, 0.004, 0.6)
		if !(got > prev) {
			t.Fatalf("LLR(%v) = %v not above LLR(%v) = %v", z, got, z-0.5, prev)
		}
		prev = got
	}
}

// TestAudit: each split's bound is EpsilonLowerBound at β/len(splits),
// and the best is the largest of them.
func TestAudit(t *testing.T) {
	const m, delta, beta = 400, 1e-5, 0.05
	scores := make([]float64, m)
	included := make([]bool, m)
	for i := range m {
		// Included canaries score high except every fifth: an imperfect
		// attack, right on most guesses near the top.
		included[i] = i%2 == 0
		scores[i] = float64(i % 7)
		if included[i] && i%5 != 0 {
			scores[i] += 10
		}
	}
	splits := []Split{{10, 0}, {50, 0}, {100, 100}}
	best, all, err := Audit(scores, included, splits, delta, beta)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(splits) {
		t.Fatalf("%d results for %d splits", len(all), len(splits))
	}
	for i, res := range all {
		r, v, err := Guess(scores, included, splits[i].KPlus, splits[i].KMinus)
		if err != nil {
			t.Fatal(err)
		}
		eps := mustBound(t, m, r, v, delta, beta/3)
		ceil, err := Ceiling(m, r, delta, beta/3)
		if err != nil {
			t.Fatal(err)
		}
		if res.R != r || res.V != v || res.Epsilon != eps || res.Ceiling != ceil {
			t.Errorf("split %v: got %+v, want r %d, v %d, ε %v, ceiling %v", splits[i], res, r, v, eps, ceil)
		}
		if res.Epsilon > best.Epsilon {
			t.Errorf("split %v's bound %v above the best's %v", splits[i], res.Epsilon, best.Epsilon)
		}
		mu := mustGDP(t, m, r, v, beta/3)
		ceilMu := mustGDP(t, m, r, r, beta/3)
		epsFDP, err1 := GDPEpsilon(mu, delta)
		ceilFDP, err2 := GDPEpsilon(ceilMu, delta)
		if err1 != nil || err2 != nil || res.GDPMu != mu || res.GDPCeilingMu != ceilMu || res.EpsilonFDP != epsFDP || res.CeilingFDP != ceilFDP {
			t.Errorf("split %v: f-DP %+v, want μ %v (ε %v), ceiling μ %v (ε %v)", splits[i], res, mu, epsFDP, ceilMu, ceilFDP)
		}
		if res.GDPMu > BestFDP(all).GDPMu {
			t.Errorf("split %v's μ %v above BestFDP's", splits[i], res.GDPMu)
		}
	}
	if !(BestFDP(all).EpsilonFDP > 0) {
		t.Errorf("best f-DP bound %v, want positive", BestFDP(all).EpsilonFDP)
	}
	if !(best.Epsilon > 0) {
		t.Errorf("best bound %v, want positive for an attack right on most guesses", best.Epsilon)
	}
	if _, _, err := Audit(scores, included, nil, delta, beta); !errors.Is(err, ErrInvalid) {
		t.Errorf("no splits: %v, want ErrInvalid", err)
	}
	if _, _, err := Audit(scores, included, []Split{{m, 1}}, delta, beta); !errors.Is(err, ErrInvalid) {
		t.Errorf("too many guesses: %v, want ErrInvalid", err)
	}
}

package accounting

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"testing"
)

// gdpLogNormUpper returns log P(N(0,1) > z), accurate far in the tail.
func gdpLogNormUpper(z float64) float64 { return math.Log(0.5) + logErfc(z/math.Sqrt2) }

// gdpDelta is the exact δ(ε) of μ-GDP (Dong, Roth, Su 2019, Cor. 2.13):
// δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), computed in log space.
func gdpDelta(mu, eps float64) float64 {
	la := gdpLogNormUpper(eps/mu - mu/2)
	lb := eps + gdpLogNormUpper(eps/mu+mu/2)
	return math.Exp(la) * -math.Expm1(lb-la)
}

// gdpEpsilon solves gdpDelta(μ, ε) = δ for ε by bisection (δ is decreasing
// in ε), to relative 1e-13.
func gdpEpsilon(mu, delta float64) float64 {
	lo, hi := 0.0, 1.0
	if gdpDelta(mu, 0) <= delta {
		return 0
	}
	for gdpDelta(mu, hi) > delta {
		lo, hi = hi, hi*2
	}
	for hi-lo > 1e-13*hi {
		mid := lo + (hi-lo)/2
		if gdpDelta(mu, mid) > delta {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// With no subsampling the Gaussian mechanism composes exactly: T steps at
// noise multiplier σ are μ-GDP with μ = √T/σ (Dong, Roth, Su 2019,
// Cor. 3.3), so the PLD ε must be at or above the exact ε and, per the
// issue, within 0.5% of it.
func TestPLDExactGaussian(t *testing.T) {
	for _, sigma := range []float64{0.5, 1, 2, 5} {
		for _, steps := range []int64{1, 10, 1000} {
			for _, delta := range []float64{1e-5, 1e-10} {
				t.Run(fmt.Sprintf("σ=%v/T=%d/δ=%v", sigma, steps, delta), func(t *testing.T) {
					got, err := PLD{}.Epsilon(SubsampledGaussian(1, sigma), steps, delta)
					if err != nil {
						t.Fatal(err)
					}
					want := gdpEpsilon(math.Sqrt(float64(steps))/sigma, delta)
					if got < want*(1-PLDNumericError) {
						t.Errorf("PLD ε = %.12g below the exact ε %.12g (relative %.3g, stated error %g)", got, want, got/want-1, PLDNumericError)
					}
					if got > want*1.005 {
						t.Errorf("PLD ε = %.12g more than 0.5%% above the exact ε %.12g (relative %.3g)", got, want, got/want-1)
					}
				})
			}
		}
	}
}

// The reference vectors' pld_epsilon (Google dp_accounting's PLDAccountant,
// value_discretization_interval 1e-4): within 0.5%, never below by more than
// 0.5% (the vectors' about field).
func TestPLDConformance(t *testing.T) {
	for _, path := range vectorFiles(t) {
		v := loadVectors(t, path)
		t.Run(filepath.Base(path), func(t *testing.T) {
			n := 0 // cases with a pld_epsilon
			for _, c := range v.Cases {
				if c.PLDEpsilon == 0 {
					continue
				}
				n++
				t.Run(c.Name, func(t *testing.T) {
					got, err := PLD{}.Epsilon(SubsampledGaussian(c.SampleRate, c.NoiseMultiplier), c.Steps, c.Delta)
					if err != nil {
						t.Fatal(err)
					}
					if rel := got/c.PLDEpsilon - 1; math.Abs(rel) > 0.005 {
						t.Errorf("PLD ε = %.12g, reference %.12g (relative %.3g > 0.5%%)", got, c.PLDEpsilon, rel)
					}
					rdp, _, err := RDP{}.EpsilonOrder(SubsampledGaussian(c.SampleRate, c.NoiseMultiplier), c.Steps, c.Delta)
					if err != nil {
						t.Fatal(err)
					}
					if got > rdp {
						t.Errorf("PLD ε = %.12g above RDP's %.12g", got, rdp)
					}
				})
			}
			if n == 0 {
				t.Fatalf("%s has no pld_epsilon cases", path)
			}
		})
	}
}

// Robustness where Opacus's PRV accountant fails: tiny δ, large ε, small σ,
// many steps, q from 1e-6 to 1. ε must be finite, non-increasing in δ,
// non-decreasing in T, and never above RDP's ε (also an upper bound) by
// more than the stated numerical error.
func TestPLDRobust(t *testing.T) {
	if raceEnabled {
		t.Skip("a numeric sweep with no concurrency: .ci/run runs it without -race (\"accounting sweeps\")")
	}
	deltas := []float64{1e-5, 1e-10, 1e-18}
	stepsList := []int64{1, 1000, 1000000}
	for _, sigma := range []float64{0.3, 2} {
		for _, q := range []float64{1e-6, 0.01, 1} {
			prevT := make([]float64, len(deltas))
			for _, steps := range stepsList {
				prevD := math.Inf(1)
				for i, delta := range deltas {
					name := fmt.Sprintf("σ=%v/q=%v/T=%d/δ=%v", sigma, q, steps, delta)
					got, err := PLD{}.Epsilon(SubsampledGaussian(q, sigma), steps, delta)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if math.IsNaN(got) || math.IsInf(got, 0) || got < 0 {
						t.Fatalf("%s: ε = %v", name, got)
					}
					rdp, _, err := RDP{}.EpsilonOrder(SubsampledGaussian(q, sigma), steps, delta)
					if err != nil {
						t.Fatal(err)
					}
					if got > rdp*(1+PLDNumericError) {
						t.Errorf("%s: PLD ε = %.10g above RDP ε %.10g", name, got, rdp)
					}
					if i > 0 && got < prevD {
						t.Errorf("%s: ε = %.10g below ε %.10g at the larger δ", name, got, prevD)
					}
					prevD = got
					if got < prevT[i] {
						t.Errorf("%s: ε = %.10g below ε %.10g at fewer steps", name, got, prevT[i])
					}
					prevT[i] = got
					t.Logf("%s: PLD ε = %.6g, RDP ε = %.6g", name, got, rdp)
				}
			}
		}
	}
}

func TestPLDLargeEpsilon(t *testing.T) {
	got, err := PLD{}.Epsilon(SubsampledGaussian(1, 0.3), 1000, 1e-10)
	if err != nil {
		t.Fatal(err)
	}
	want := gdpEpsilon(math.Sqrt(1000)/0.3, 1e-10)
	if want < 50 {
		t.Fatalf("test case not in the large-ε regime: exact ε = %v", want)
	}
	if got < want*(1-PLDNumericError) || got > want*1.005 {
		t.Errorf("PLD ε = %.10g, exact %.10g", got, want)
	}
}

// Events with different (q, σ) compose: splitting T identical steps into
// two events changes nothing, and a mixed composition lies between the two
// pure ones.
func TestPLDComposeEvents(t *testing.T) {
	const q, delta = 0.01, 1e-6
	whole, err := PLD{}.Epsilon(SubsampledGaussian(q, 1), 2000, delta)
	if err != nil {
		t.Fatal(err)
	}
	split, err := PLD{}.EpsilonSteps([]PLDEvent{{SampleRate: q, NoiseMultiplier: 1, Count: 500}, {SampleRate: q, NoiseMultiplier: 1, Count: 1500}}, delta)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(split/whole-1) > 1e-4 {
		t.Errorf("split composition ε = %.10g, whole %.10g", split, whole)
	}
	noisy, err := PLD{}.Epsilon(SubsampledGaussian(q, 2), 2000, delta)
	if err != nil {
		t.Fatal(err)
	}
	mixed, err := PLD{}.EpsilonSteps([]PLDEvent{{SampleRate: q, NoiseMultiplier: 1, Count: 1000}, {SampleRate: q, NoiseMultiplier: 2, Count: 1000}}, delta)
	if err != nil {
		t.Fatal(err)
	}
	if !(mixed > noisy && mixed < whole) {
		t.Errorf("mixed ε = %.10g not between %.10g (σ=2) and %.10g (σ=1)", mixed, noisy, whole)
	}
	// RDP of the same mixed events is an upper bound too, and looser.
	acc := RDP{}.NewComposition()
	_ = acc.Compose(SubsampledGaussian(q, 1), 1000)
	_ = acc.Compose(SubsampledGaussian(q, 2), 1000)
	rdp, _, _ := acc.Epsilon(delta)
	if mixed > rdp {
		t.Errorf("mixed PLD ε = %.10g above RDP %.10g", mixed, rdp)
	}
}

func TestPLDCalibrateSigma(t *testing.T) {
	for _, c := range []struct {
		target, q float64
		steps     int64
		delta     float64
	}{
		{3, 0.004266666666666667, 2343, 1e-5},
		{1, 0.1, 512, 1e-6},
	} {
		sigma, err := PLD{}.Calibrate(c.target, c.steps, c.delta, func(s float64) Event { return SubsampledGaussian(c.q, s) })
		if err != nil {
			t.Fatal(err)
		}
		eps, err := PLD{}.Epsilon(SubsampledGaussian(c.q, sigma), c.steps, c.delta)
		if err != nil {
			t.Fatal(err)
		}
		if eps > c.target {
			t.Errorf("σ = %.10g gives PLD ε = %.12g > target %v", sigma, eps, c.target)
		}
		// Smallest: 0.1% less noise overshoots the target.
		if e, _ := (PLD{}).Epsilon(SubsampledGaussian(c.q, sigma*(1-1e-3)), c.steps, c.delta); e <= c.target {
			t.Errorf("σ·(1−1e-3) = %.10g still gives ε = %.12g ≤ target %v", sigma*(1-1e-3), e, c.target)
		}
		rdpSigma, err := RDP{}.Calibrate(c.target, c.steps, c.delta, func(s float64) Event { return SubsampledGaussian(c.q, s) })
		if err != nil {
			t.Fatal(err)
		}
		if sigma >= rdpSigma {
			t.Errorf("PLD σ = %.10g not below RDP σ = %.10g", sigma, rdpSigma)
		}
		t.Logf("target ε=%v: PLD σ = %.6f, RDP σ = %.6f", c.target, sigma, rdpSigma)
	}
}

func TestPLDRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []PLDEvent
		delta  float64
	}{
		{"q zero", []PLDEvent{{SampleRate: 0, NoiseMultiplier: 1, Count: 10}}, 1e-5},
		{"q above one", []PLDEvent{{SampleRate: 1.5, NoiseMultiplier: 1, Count: 10}}, 1e-5},
		{"sigma zero", []PLDEvent{{SampleRate: 0.1, NoiseMultiplier: 0, Count: 10}}, 1e-5},
		{"sigma inf", []PLDEvent{{SampleRate: 0.1, NoiseMultiplier: math.Inf(1), Count: 10}}, 1e-5},
		{"negative count", []PLDEvent{{SampleRate: 0.1, NoiseMultiplier: 1, Count: -1}}, 1e-5},
		{"no steps", []PLDEvent{{SampleRate: 0.1, NoiseMultiplier: 1, Count: 0}}, 1e-5},
		{"delta zero", []PLDEvent{{SampleRate: 0.1, NoiseMultiplier: 1, Count: 10}}, 0},
		{"delta one", []PLDEvent{{SampleRate: 0.1, NoiseMultiplier: 1, Count: 10}}, 1},
		{"delta NaN", []PLDEvent{{SampleRate: 0.1, NoiseMultiplier: 1, Count: 10}}, math.NaN()},
	} {
		if _, err := (PLD{}).EpsilonSteps(tc.events, tc.delta); !errors.Is(err, ErrInvalidParameter) {
			t.Errorf("%s: err = %v, want ErrInvalidParameter", tc.name, err)
		}
	}
	if _, err := (PLD{}).Calibrate(0, 10, 1e-5, func(s float64) Event { return SubsampledGaussian(0.1, s) }); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("target 0: err = %v", err)
	}
}

func BenchmarkPLDEpsilon10kSteps(b *testing.B) {
	for b.Loop() {
		ResetCaches() // time the computation, not the memo
		if _, err := (PLD{}).Epsilon(SubsampledGaussian(0.004266666666666667, 1.1), 10000, 1e-5); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPLDCalibrateSigma(b *testing.B) {
	for b.Loop() {
		ResetCaches() // time the computation, not the memo
		if _, err := (PLD{}).Calibrate(3, 2343, 1e-5, func(s float64) Event { return SubsampledGaussian(0.004266666666666667, s) }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPLDEpsilonDiscrete10kSteps is BenchmarkPLDEpsilon10kSteps for the
// leader's discrete Gaussian on the main job's lattice (d = 269,322): the
// Gaussian's composition plus the lattice slack's few extra solves.
func BenchmarkPLDEpsilonDiscrete10kSteps(b *testing.B) {
	const dim = 269322
	ev := []PLDEvent{{SampleRate: 256.0 / 60000, NoiseMultiplier: 1.1, Count: 10000, Dimension: dim,
		LatticeScale: math.Ceil(1.1 * 65537 * math.Sqrt(dim))}}
	for range b.N {
		ResetCaches() // time the computation, not the memo
		if _, err := (PLD{}).EpsilonSteps(ev, 1e-5); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPLDMemo: EpsilonSteps remembers its results by their exact
// inputs: a repeated call returns the value the computation gave, which a
// fresh computation (the memo cleared) gives again; inputs that differ in
// any field, or in δ, are not confused.
func TestPLDMemo(t *testing.T) {
	ev := []PLDEvent{{SampleRate: 0.01, NoiseMultiplier: 1.1, Count: 300}}
	first, err := PLD{}.EpsilonSteps(ev, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pldMemoGet(pldMemoKey(ev, 1e-5)); !ok {
		t.Fatal("the result was not remembered")
	}
	again, _ := PLD{}.EpsilonSteps(ev, 1e-5)
	ResetCaches()
	fresh, _ := PLD{}.EpsilonSteps(ev, 1e-5)
	if again != first || fresh != first {
		t.Errorf("remembered %v, first %v, fresh %v", again, first, fresh)
	}
	for _, other := range []struct {
		ev    []PLDEvent
		delta float64
	}{
		{[]PLDEvent{{SampleRate: 0.01, NoiseMultiplier: 1.1, Count: 301}}, 1e-5},
		{[]PLDEvent{{SampleRate: 0.01, NoiseMultiplier: 1.2, Count: 300}}, 1e-5},
		{[]PLDEvent{{SampleRate: 0.02, NoiseMultiplier: 1.1, Count: 300}}, 1e-5},
		{ev, 1e-6},
	} {
		got, err := PLD{}.EpsilonSteps(other.ev, other.delta)
		if err != nil || got == first {
			t.Errorf("%+v at δ %v: %v, %v (the first input's ε is %v)", other.ev, other.delta, got, err, first)
		}
	}
}

// TestPLDDiscretizationError measures the accountant's discretization
// excess: ε on its window against ε on a window four times as fine. The
// excess shrinks like h² (accounting/pld.go), so ε(h) − ε* ≈ (16/15)·(ε(h) −
// ε(h/4)) (Richardson); it must stay below 5e-4 relative for runs of 1 to
// 10⁴ steps, and the finer value must not be above the coarser one by more
// than round-off (the pessimistic PLD on a finer grid is tighter).
func TestPLDDiscretizationError(t *testing.T) {
	cases := []struct {
		q, sigma float64
		counts   []int64
	}{
		{256.0 / 60000, 0.6431, []int64{1, 10, 300, 1000, 10000}},
		{0.01, 1.1, []int64{1, 30, 64, 100, 200, 3000}},
		{0.05, 0.8, []int64{50, 500}},
		{0.1, 2, []int64{2, 1000}},
		{1, 5, []int64{1, 100}},
	}
	worst := 0.0
	for _, c := range cases {
		for _, n := range c.counts {
			ev := []PLDEvent{{SampleRate: c.q, NoiseMultiplier: c.sigma, Count: n}}
			coarse, err := pldEpsilonFine(ev, 1e-5, 0)
			if err != nil {
				t.Fatal(err)
			}
			fine, err := pldEpsilonFine(ev, 1e-5, 2)
			if err != nil {
				t.Fatal(err)
			}
			excess := (coarse/fine - 1) * 16 / 15
			worst = max(worst, excess)
			if excess < -1e-9 || excess > 5e-4 {
				t.Errorf("q=%v σ=%v %d steps: ε %.9g on the window, %.9g on one 4× as fine: excess ≈ %.2e, want in [0, 5e-4]", c.q, c.sigma, n, coarse, fine, excess)
			}
		}
	}
	t.Logf("largest excess %.2e", worst)
}

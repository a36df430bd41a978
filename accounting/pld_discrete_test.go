package accounting

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// exactDiscreteGaussianTV sums |N_ℤ(0, s²)(n) − P(round(N(0, s²)) = n)|/2
// over |n| ≤ 40s directly (the mass beyond is below e^{−800}).
func exactDiscreteGaussianTV(s float64) float64 {
	lim := int(math.Ceil(40 * s))
	z := 0.0
	for n := -lim; n <= lim; n++ {
		z += math.Exp(-float64(n*n) / (2 * s * s))
	}
	tv := 0.0
	for n := -lim; n <= lim; n++ {
		p := math.Exp(-float64(n*n)/(2*s*s)) / z
		// P(n−½ < Y < n+½) from the side of the smaller tail.
		a, b := (math.Abs(float64(n))-0.5)/(s*math.Sqrt2), (math.Abs(float64(n))+0.5)/(s*math.Sqrt2)
		var r float64
		if n == 0 {
			r = math.Erf(b)
		} else {
			r = 0.5 * (math.Erfc(a) - math.Erfc(b))
		}
		tv += math.Abs(p - r)
	}
	return tv / 2
}

// TestDiscreteGaussianTVBound: DiscreteGaussianTV bounds the exact total
// variation distance between the discrete and the rounded Gaussian from
// above, from s = 1 (where Poisson summation's corrections are largest) to
// s = 300, and is within a factor 2.5 of it from s = 2 on (3.1 below);
// outside s ≥ 1 it is +Inf.
func TestDiscreteGaussianTVBound(t *testing.T) {
	for _, s := range []float64{1, 1.1, 1.5, 2, 3, 4.7, 8, 13, 30, 75, 300} {
		exact, bound := exactDiscreteGaussianTV(s), DiscreteGaussianTV(s)
		ratio := 2.5
		if s < 2 {
			ratio = 3.1
		}
		if !(bound >= exact) || bound > ratio*exact {
			t.Errorf("s=%v: bound %.6g, exact %.6g (ratio %.3f): want bound in [exact, %v·exact]", s, bound, exact, bound/exact, ratio)
		}
	}
	// The large-s form 1/(24s²) (the exact value falls like 1/(49.6s²)).
	if s := 1e7; math.Abs(DiscreteGaussianTV(s)*24*s*s-1) > 1e-9 {
		t.Errorf("s=%v: TV·24s² = %v, want 1", s, DiscreteGaussianTV(s)*24*s*s)
	}
	for _, s := range []float64{0.99, 0, -1, math.NaN(), math.Inf(1)} {
		if !math.IsInf(DiscreteGaussianTV(s), 1) {
			t.Errorf("s=%v: %v, want +Inf", s, DiscreteGaussianTV(s))
		}
	}
}

// exactDiscreteDelta returns δ(ε) of one release of the 1-D discrete
// Gaussian with integer shift k and scale s, Poisson-sampled with rate q,
// the larger over the two adjacency directions, by direct summation:
// P0 = N_ℤ(0, s²), P1 = N_ℤ(k, s²), M = (1−q)P0 + qP1, and
// δ = max(Σ (M − e^ε P0)⁺, Σ (P0 − e^ε M)⁺).
func exactDiscreteDelta(q, s float64, k int, eps float64) float64 {
	lim := int(math.Ceil(40*s)) + k
	var lp0, lp1 []float64
	for n := -lim; n <= lim; n++ {
		lp0 = append(lp0, -float64(n*n)/(2*s*s))
		d := float64(n - k)
		lp1 = append(lp1, -d*d/(2*s*s))
	}
	norm := logSumExp(lp0)
	var rem, add float64
	for i := range lp0 {
		p0 := math.Exp(lp0[i] - norm)
		m := (1-q)*p0 + q*math.Exp(lp1[i]-norm)
		rem += math.Max(m-math.Exp(eps)*p0, 0)
		add += math.Max(p0-math.Exp(eps)*m, 0)
	}
	return math.Max(rem, add)
}

// TestPLDDiscreteAgainstExact: for the 1-D discrete Gaussian, where the
// privacy profile can be summed exactly, the accountant's ε (Gaussian PLD
// plus the lattice slack) is never below the exact ε: the exact δ at the
// reported ε is within δ. And it is tight: the exact δ at 0.97·ε exceeds δ.
// The shifts are integers with the noise multiplier s/k; the scales are
// large enough that the lattice slack (1 + e^ε)·τ(s) is a small part of δ
// (for d = 1, s ≥ 10⁴; the leader's lattice has s ≥ 6·10⁴·σ·√d).
func TestPLDDiscreteAgainstExact(t *testing.T) {
	const delta = 1e-5
	for _, c := range []struct {
		q, s float64
		k    int
		name string
	}{
		{1, 3e4, 1e4, "no sampling, σ=3"},
		{1, 2e4, 2e4, "no sampling, σ=1"},
		{0.5, 1.6e4, 2e4, "q=0.5, σ=0.8"},
		{0.05, 1.2e4, 2e4, "q=0.05, σ=0.6"},
	} {
		sigma := c.s / float64(c.k)
		eps, err := PLD{}.EpsilonSteps([]PLDEvent{{SampleRate: c.q, NoiseMultiplier: sigma, Count: 1, Dimension: 1, LatticeScale: c.s}}, delta)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if d := exactDiscreteDelta(c.q, c.s, c.k, eps); d > delta {
			t.Errorf("%s: reported ε=%.6g, but the exact δ there is %.6g > %v", c.name, eps, d, delta)
		}
		if d := exactDiscreteDelta(c.q, c.s, c.k, 0.97*eps); !(d > delta) {
			t.Errorf("%s: reported ε=%.6g is loose: exact δ at 0.97ε is %.6g ≤ %v", c.name, eps, d, delta)
		}
	}
}

// TestPLDDiscreteSlack: the discrete event's ε satisfies its defining
// inequality δ_Gaussian(ε) + (1 + e^ε)·T·d·τ(s) ≤ δ (checked through the
// continuous accountant at the reduced δ), lies between the continuous
// Gaussian's ε at the same σ and the discrete Gaussian's RDP ε, costs
// almost nothing at the main job's lattice, and grows as the lattice
// coarsens; where the slack eats δ it falls back to RDP, finite, no error.
func TestPLDDiscreteSlack(t *testing.T) {
	const q, sigma, steps, delta = 256.0 / 60000, 0.7, 1000, 1e-5
	cont, err := PLD{}.Epsilon(SubsampledGaussian(q, sigma), steps, delta)
	if err != nil {
		t.Fatal(err)
	}
	rdp, _, err := RDP{}.EpsilonOrder(SubsampledDiscreteGaussian(q, sigma), steps, delta)
	if err != nil {
		t.Fatal(err)
	}
	disc := func(scale float64, dim int64) float64 {
		e, err := PLD{}.EpsilonSteps([]PLDEvent{{SampleRate: q, NoiseMultiplier: sigma, Count: steps, Dimension: dim, LatticeScale: scale}}, delta)
		if err != nil {
			t.Fatalf("scale %v, dim %d: %v", scale, dim, err)
		}
		return e
	}
	// The main job's lattice: d = 269,322, s ≈ σ·(2¹⁶+1)·√d·(1..2).
	const dim = 269322
	mainScale := math.Ceil(sigma * 65537 * math.Sqrt(dim))
	main := disc(mainScale, dim)
	if !(main >= cont) || main > cont*(1+5e-3) {
		t.Errorf("main job lattice: ε=%.8g, continuous %.8g: want within 0.5%% above", main, cont)
	}
	prev := main
	// Coarser lattices: τ grows as 1/s², and so does the slack.
	for _, scale := range []float64{3e6, 1e6, 4e5, 2e5} {
		e := disc(scale, dim)
		tv := float64(steps) * dim * DiscreteGaussianTV(scale)
		reduced := delta - (1+math.Exp(e))*tv
		if !(reduced > 0) {
			if e != rdp {
				t.Errorf("scale %v: slack %v exceeds δ but ε=%v is not RDP's %v", scale, tv, e, rdp)
			}
			continue
		}
		check, err := PLD{}.Epsilon(SubsampledGaussian(q, sigma), steps, reduced)
		if err != nil {
			t.Fatal(err)
		}
		if check > e*(1+1e-12) {
			t.Errorf("scale %v: ε=%.8g but the Gaussian needs %.8g at the reduced δ=%.4g", scale, e, check, reduced)
		}
		if e < prev || e > rdp {
			t.Errorf("scale %v: ε=%.8g, want in [%.8g (finer lattice), %.8g (RDP)]", scale, e, prev, rdp)
		}
		prev = e
	}
	if e := disc(2, 1000); e != rdp {
		t.Errorf("a coarse lattice (s=2): ε=%v, want the RDP fallback %v", e, rdp)
	}
}

// TestPLDDiscreteEvents: the event plumbing. A discrete Gaussian names a
// lattice or not; the PLD accountant charges only one that does; a lattice
// on another kind, or an inconsistent one, is invalid; the fields survive
// Marshal and an event without them keeps its old bytes.
func TestPLDDiscreteEvents(t *testing.T) {
	lat := PoissonSampled(0.01, DiscreteGaussianLattice(0.8, 1e6, 100))
	if err := lat.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := PLDStep(lat)
	if err != nil || s != (PLDEvent{SampleRate: 0.01, NoiseMultiplier: 0.8, Count: 1, Dimension: 100, LatticeScale: 1e6}) {
		t.Errorf("PLDStep(lattice) = %+v, %v", s, err)
	}
	if _, err := PLDStep(SubsampledDiscreteGaussian(0.01, 0.8)); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("PLDStep(no lattice) = %v, want ErrInvalidEvent", err)
	}
	b, err := lat.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalEvent(b)
	if err != nil || !back.Equal(lat) {
		t.Errorf("round trip: %+v, %v", back, err)
	}
	if back.Equal(SubsampledDiscreteGaussian(0.01, 0.8)) {
		t.Error("an event with a lattice equals one without")
	}
	old, err := SubsampledDiscreteGaussian(0.01, 0.8).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"format":1,"event":{"kind":"poisson_sampled","sample_rate":0.01,"event":{"kind":"discrete_gaussian","noise_multiplier":0.8}}}`; string(old) != want {
		t.Errorf("event without a lattice marshals to %s, want its old bytes %s", old, want)
	}
	for _, bad := range []Event{
		{Kind: KindGaussian, NoiseMultiplier: 1, Dimension: 3, LatticeScale: 10},
		PoissonSampled(0.1, Event{Kind: KindGaussian, NoiseMultiplier: 1, LatticeScale: 10}),
		DiscreteGaussianLattice(1, 10, 0),
		DiscreteGaussianLattice(1, 0, 10),
		DiscreteGaussianLattice(1, 0.5, 10),
		DiscreteGaussianLattice(20, 10, 10), // scale below σ: sensitivity < 1
		DiscreteGaussianLattice(1, math.Inf(1), 10),
		DiscreteGaussianLattice(1, math.NaN(), 10),
		DiscreteGaussianLattice(1, 10, -1),
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("%+v: %v, want ErrInvalidEvent", bad, err)
		}
	}
	for _, bad := range []PLDEvent{
		{SampleRate: 0.1, NoiseMultiplier: 1, Count: 1, Dimension: 10},
		{SampleRate: 0.1, NoiseMultiplier: 1, Count: 1, LatticeScale: 10},
		{SampleRate: 0.1, NoiseMultiplier: 1, Count: 1, Dimension: 10, LatticeScale: 0.5},
		{SampleRate: 0.1, NoiseMultiplier: 1, Count: 1, Dimension: -1, LatticeScale: 10},
	} {
		if _, err := (PLD{}).EpsilonSteps([]PLDEvent{bad}, 1e-5); !errors.Is(err, ErrInvalidParameter) {
			t.Errorf("%+v: %v, want ErrInvalidParameter", bad, err)
		}
	}
}

// TestPLDCalibrateDiscrete: calibrating σ for the discrete event returns
// the smallest σ (to the bisection's precision) whose discrete PLD ε is
// within the target, never above it, and below RDP's σ for the same event.
func TestPLDCalibrateDiscrete(t *testing.T) {
	const q, steps, delta, target, dim = 0.01, 300, 1e-5, 2.0, 5000
	// The leader's lattice: s = ⌈σ·L⌉ for a fixed L = C/Λ, sensitivity L + √d.
	const lat = 1 << 23
	event := func(sigma float64) Event {
		s := math.Ceil(sigma * lat)
		return PoissonSampled(q, DiscreteGaussianLattice(s/(lat+math.Sqrt(dim)), s, dim))
	}
	sigma, err := PLD{}.Calibrate(target, steps, delta, event)
	if err != nil {
		t.Fatal(err)
	}
	eps := func(sigma float64) float64 {
		s, err := PLDStep(event(sigma))
		if err != nil {
			t.Fatal(err)
		}
		s.Count = steps
		e, err := PLD{}.EpsilonSteps([]PLDEvent{s}, delta)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if e := eps(sigma); e > target {
		t.Errorf("σ=%v: ε=%v above the target %v", sigma, e, target)
	}
	if e := eps(sigma * (1 - 1e-5)); !(e > target) {
		t.Errorf("σ=%v is not the smallest: 1e-5 less still gives ε=%v", sigma, e)
	}
	rdpSigma, err := RDP{}.Calibrate(target, steps, delta, event)
	if err != nil {
		t.Fatal(err)
	}
	if !(sigma < rdpSigma) {
		t.Errorf("PLD σ %v not below RDP σ %v", sigma, rdpSigma)
	}
	if _, err := (PLD{}).Calibrate(target, steps, delta, func(s float64) Event { return SubsampledDiscreteGaussian(q, s) }); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("calibrating a discrete event without a lattice: %v, want ErrInvalidEvent", err)
	}
}

// TestPLDDiscreteRobust is TestPLDRobust for the leader's discrete
// Gaussian on the main job's lattice (d = 269,322, s = ⌈σ·(2¹⁶+1)·√d⌉):
// δ down to 1e-18, σ down to 0.3, T up to 10⁶, q 1e-6 and 1. ε is
// finite, non-increasing in δ, non-decreasing in T, never above the
// discrete RDP bound, and at least the continuous Gaussian's PLD ε. (Where
// the lattice slack (1 + e^ε)·Tdτ is not small against δ, at δ = 1e-18 or
// ε in the tens, the answer is the RDP bound.)
func TestPLDDiscreteRobust(t *testing.T) {
	if raceEnabled {
		t.Skip("a numeric sweep with no concurrency: .ci/run runs it without -race (\"accounting sweeps\")")
	}
	const dim = 269322
	deltas := []float64{1e-5, 1e-18}
	for _, sigma := range []float64{0.3, 2} {
		scale := math.Ceil(sigma * 65537 * math.Sqrt(dim))
		for _, q := range []float64{1e-6, 1} {
			prevT := make([]float64, len(deltas))
			for _, steps := range []int64{1, 1000, 1000000} {
				prevD := math.Inf(1)
				for i, delta := range deltas {
					name := fmt.Sprintf("σ=%v/q=%v/T=%d/δ=%v", sigma, q, steps, delta)
					got, err := PLD{}.EpsilonSteps([]PLDEvent{{SampleRate: q, NoiseMultiplier: sigma, Count: steps, Dimension: dim, LatticeScale: scale}}, delta)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if math.IsNaN(got) || math.IsInf(got, 0) || got < 0 {
						t.Fatalf("%s: ε = %v", name, got)
					}
					rdp, _, err := RDP{}.EpsilonOrder(SubsampledDiscreteGaussian(q, sigma), steps, delta)
					if err != nil {
						t.Fatal(err)
					}
					cont, err := PLD{}.Epsilon(SubsampledGaussian(q, sigma), steps, delta)
					if err != nil {
						t.Fatal(err)
					}
					if got > rdp || got < cont*(1-PLDNumericError) {
						t.Errorf("%s: ε = %.10g, want in [continuous PLD %.10g, discrete RDP %.10g]", name, got, cont, rdp)
					}
					if i > 0 && got < prevD {
						t.Errorf("%s: ε = %.10g below ε %.10g at the larger δ", name, got, prevD)
					}
					prevD = got
					if got < prevT[i] {
						t.Errorf("%s: ε = %.10g below ε %.10g at fewer steps", name, got, prevT[i])
					}
					prevT[i] = got
					t.Logf("%s: ε = %.6g (continuous PLD %.6g, discrete RDP %.6g)", name, got, cont, rdp)
				}
			}
		}
	}
}

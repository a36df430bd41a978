package accounting

import (
	"math"
	"slices"
)

// This file places the PLD accountant's composition window (accounting/pld.go,
// "Composition by FFT, with exponential tilting"): its span from Chernoff
// bounds, its spacing h, the tilt, and each step's range of grid points.

// pldWindowBits sets the smallest FFT size N = 2^pldWindowBits of the
// composition window.
const pldWindowBits = 14

// pldMaxWindowBits caps the FFT size for very long compositions.
const pldMaxWindowBits = 23

// pldMaxStep caps the number of grid points of one step's discretized PLD;
// a longer step is folded modulo N (exact for a cyclic convolution).
const pldMaxStep = 1 << 23

// gaussTail is the number of standard deviations of x beyond which a step's
// density is treated as tail (moved pessimistically, never dropped: below
// the grid onto its lowest point, above it to +∞). Φ(−20) ≈ 3e-89, so even
// 10⁶ steps move less than 1e-82 to +∞.
const gaussTail = 20

// pldDirection is one of the two ordered pairs of the mechanism.
type pldDirection int

const (
	pldRemove pldDirection = iota // P = M, Q = μ0
	pldAdd                        // P = μ0, Q = M
)

// pldWindow is the composition grid: N points ℓ_i = (lo+i)·h, and the tilt.
type pldWindow struct {
	h      float64
	lo     int64 // grid index of the window's first point
	n      int
	lambda float64 // the tilt
	tTop   float64 // the Chernoff exponent at the window's top
}

// chernoffLogMGF returns Σ count·t·D_{1+t}(M‖μ0), the log moment generating
// function at t of the composed remove-direction loss (Mironov, Talwar,
// Zhang 2019: E_M[(M/μ0)^t] = A_{1+t}); it also bounds the add direction's
// (Mironov et al. 2019, Sec. 3.3: B_α ≤ A_α). Used only to place the window
// and choose the tilt; rigour comes from (3) on the discretized PLD.
func chernoffLogMGF(events []PLDEvent, t float64) float64 {
	s := 0.0
	for _, e := range events {
		s += float64(e.Count) * t * SubsampledGaussianRDP(e.SampleRate, e.NoiseMultiplier, 1+t)
	}
	return s
}

// chernoffQuantile returns min_t (K(t) + log(1/tau))/t and its minimizer:
// the Chernoff bound's loss level above which the composed loss has
// probability at most tau.
func chernoffQuantile(events []PLDEvent, tau float64) (level, t float64) {
	f := func(lt float64) float64 {
		t := math.Exp(lt)
		return (chernoffLogMGF(events, t) - math.Log(tau)) / t
	}
	// Golden-section search on log t over [1e-4, 2e3]; f is unimodal in t
	// (K convex, K(0) = 0).
	a, b := math.Log(1e-4), math.Log(2e3)
	g := (math.Sqrt(5) - 1) / 2
	c, d := b-g*(b-a), a+g*(b-a)
	fc, fd := f(c), f(d)
	for i := 0; i < 60; i++ {
		if fc < fd {
			b, d, fd = d, c, fc
			c = b - g*(b-a)
			fc = f(c)
		} else {
			a, c, fc = c, d, fd
			d = a + g*(b-a)
			fd = f(d)
		}
	}
	lt := (a + b) / 2
	return f(lt), math.Exp(lt)
}

// pldWindowFor places the composition window and picks the tilt for
// queries at delta (heuristics: validity does not depend on them) for any
// counts between those of lo and hi (the same events), with 2^fine times
// the points the rule below gives (0 but in tests).
func pldWindowFor(lo, hi []PLDEvent, delta float64, fine int) pldWindow {
	// The answer is near the Chernoff level at δ; the window reaches the
	// level at δ·1e-12 above (for hi's counts) and twice as far below the
	// mean (for lo's).
	_, lambda := chernoffQuantile(hi, delta)
	top, tTop := chernoffQuantile(hi, delta*1e-12)
	const ts = 1e-4
	mean := chernoffLogMGF(hi, ts) / ts // ≈ Σ count·KL
	meanLo := mean
	topLo := top
	if !slices.Equal(lo, hi) {
		meanLo = chernoffLogMGF(lo, ts) / ts
		topLo, _ = chernoffQuantile(lo, delta*1e-12)
	}
	bottom := math.Max(meanLo-2*(topLo-meanLo), -80)
	if top-bottom < 1e-9 {
		bottom, top = bottom-1e-9, top+1e-9
	}
	// N: at least 2^pldWindowBits, and enough that the discretization's
	// O(T·h²/8) upward drift of the composed mean stays below 5e-5 of
	// the window's upper reach (top − mean), up to 2^pldMaxWindowBits.
	var steps float64
	for _, e := range hi {
		steps += float64(e.Count)
	}
	n := 1 << pldWindowBits
	if reach := top - mean; reach > 0 {
		hMax := math.Sqrt(4e-4 * reach / steps)
		for n < 1<<pldMaxWindowBits && (top-bottom)/float64(n-1) > hMax {
			n *= 2
		}
	}
	n <<= fine
	h := (top - bottom) / float64(n-1)
	return pldWindow{h: h, lo: int64(math.Floor(bottom / h)), n: n, lambda: lambda, tTop: tTop}
}

// stepRange returns the grid indices [jlo, jhi] for one event's step:
// beyond gaussTail standard deviations of x (where the Gaussian tails
// underflow) and, where losses are bounded on one side, no further than the
// window can use.
func (w pldWindow) stepRange(events []PLDEvent, i int, dir pldDirection) (jlo, jhi int64) {
	e := events[i]
	q, s := e.SampleRate, e.NoiseMultiplier
	// Natural range of L over x within gaussTail σ of both means.
	lA, lB := lossOf(q, s, -gaussTail*s), lossOf(q, s, 1+gaussTail*s)
	if dir == pldAdd {
		lA, lB = -lB, -lA
	}
	// Sums of the other steps' extreme losses, where finite, bound how far
	// this step's loss can usefully reach.
	var othersMin, othersMax float64
	for k, o := range events {
		c := float64(o.Count)
		if k == i {
			c--
		}
		if c == 0 {
			continue
		}
		bound := math.Log1p(-o.SampleRate) // remove: L ≥ log(1−q); add: L ≤ −log(1−q)
		if dir == pldRemove {
			othersMin += c * bound
			othersMax = math.Inf(1)
		} else {
			othersMax += c * -bound
			othersMin = math.Inf(-1)
		}
	}
	wlo := float64(w.lo) * w.h
	whi := float64(w.lo+int64(w.n)-1) * w.h
	if !math.IsInf(othersMin, -1) {
		lB = math.Min(lB, whi-othersMin+w.h)
	}
	if !math.IsInf(othersMax, 1) {
		lA = math.Max(lA, wlo-othersMax-w.h)
	}
	if lB < lA {
		lB = lA
	}
	jlo = int64(math.Floor(lA / w.h))
	jhi = int64(math.Ceil(lB / w.h))
	if jhi-jlo+1 > pldMaxStep {
		jhi = jlo + pldMaxStep - 1 // the rest goes pessimistically to +∞
	}
	return jlo, jhi
}

package privacyaudit

import (
	"fmt"
	"math"
)

// The f-DP test for any symmetric trade-off function f (the derivation in
// privacyaudit/fdp.go holds for every such f through g(x) = f(1 − x),
// nondecreasing): CurveRejects, of which GDPRejects is the instance
// f = G_μ. ProfileInverseTradeoff builds a g from finitely many (ε, δ)
// points of a privacy profile, which is how the run's own curve is tested
// (privacyaudit/runcurve.go).

// CurveRejects reports whether v correct guesses out of r, among m
// canaries, reject at level β the hypothesis that the mechanism is f-DP,
// for the symmetric trade-off function f given by g(x) = f(1 − x): the
// recursion of privacyaudit/fdp.go (steps 1–3), with its rounding
// directed so that a rejection is one exact arithmetic makes too,
// provided g(x) is at most the exact f(1 − x) at every x in [0, 1] (the
// caller's numeric direction) and nondecreasing. A value of g that is NaN
// or negative counts as 0 and one above 1 as 1 (both in the direction of
// not rejecting). It returns ErrInvalid for the counts of
// EpsilonLowerBound, a nil g, β outside (0, 1).
func CurveRejects(m, r, v int, g func(x float64) float64, beta float64) (bool, error) {
	if err := checkCounts(m, r, v); err != nil {
		return false, err
	}
	if g == nil {
		return false, fmt.Errorf("%w: no trade-off function", ErrInvalid)
	}
	if !(beta > 0 && beta < 1) {
		return false, fmt.Errorf("%w: β = %v, want 0 < β < 1", ErrInvalid, beta)
	}
	return curveRejects(m, r, v, g, beta), nil
}

// curveRejects is CurveRejects for valid arguments (k = r, τ = β).
func curveRejects(m, k, v int, g func(float64) float64, tau float64) bool {
	fm, fk := float64(m), float64(k)
	limit := math.Nextafter(fk/fm, math.Inf(1)) // ≥ k/m
	if v == 0 {
		return false // s_0 = τk/m < k/m
	}
	gc := func(x float64) float64 {
		h := g(x)
		if !(h >= 0) {
			return 0
		}
		return min(h, 1)
	}
	rNext := down(down(tau*float64(v)) / fm)               // r_v ≤ τv/m
	kConst := down(down(down(tau*fk)/fm) / float64(k-v+1)) // K ≤ τk/(m(k−v+1))
	var h, acc float64                                     // h_{i+1}; Σ_{j>i} (w_j − w_{j−1})·h_j
	for i := v - 1; i >= 0; i-- {
		hi := gc(rNext)
		if i < v-1 {
			hi = max(hi, h)
			// w_{i+1} − w_i = k/((k−i)(k−i−1)); the product of two
			// integers below 2²⁰ is exact.
			dw := down(fk / (float64(k-i) * float64(k-i-1)))
			acc = down(acc + down(dw*h))
		}
		h = hi
		wi := down(float64(i) / float64(k-i))
		rNext = down(down(kConst+down(wi*h)) + acc) // r_i
		if down(rNext+h) > limit {
			return true // s only grows as i falls
		}
	}
	return false
}

// EpsDelta is one point of a privacy profile: the mechanism is (ε, δ)-DP
// in both directions of neighbouring (adding and removing one record).
type EpsDelta struct {
	Epsilon, Delta float64
}

// profileSlack is the absolute amount each term of
// ProfileInverseTradeoff is lowered by: above the rounding error of the
// few operations on values in [0, 1] (and a product with e^{−ε} ≤ 1)
// that compute it, which is a few times 2⁻⁵³.
const profileSlack = 0x1p-48

// ProfileInverseTradeoff returns g(x) = f(1 − x) for the trade-off
// function f(α) = max over the points of max(0, 1 − δ − e^ε·α,
// e^{−ε}·(1 − δ − α)), the least trade-off curve of a mechanism that is
// (ε, δ)-DP in both directions for every point given: for a test φ with
// type I error α = E_P[φ] and type II error β = 1 − E_Q[φ], (ε, δ)-DP
// gives 1 − β = E_Q[φ] ≤ e^ε·α + δ and 1 − α = E_P[1 − φ] ≤ e^ε·β + δ,
// the two lines (Dong, Roth and Su, "Gaussian Differential Privacy", §2:
// f_{ε,δ}, and f-DP for several f is f-DP for their maximum). So g is
//
//	g(x) = max(0, max_i (1 − δ_i − e^{ε_i}·(1 − x)), max_i e^{−ε_i}·(x − δ_i)),
//
// nondecreasing in x. Each term is lowered by an absolute 2⁻⁴⁸ (above its
// rounding error, a few times 2⁻⁵³: the operands are in [0, 1] wherever
// the term is positive), so the value is at most the exact g of the
// points, as CurveRejects needs; the points themselves must be valid
// (an ε from an accountant with a relative error below the exact one
// must be raised by that error first: RunFamily does). A point with ε
// NaN, negative or above 700 (e^ε near overflow: it bounds nothing
// below x = 1), or δ NaN or outside [0, 1], is ignored.
func ProfileInverseTradeoff(points []EpsDelta) func(x float64) float64 {
	type line struct{ e, delta float64 } // e^ε, δ
	ls := make([]line, 0, len(points))
	for _, p := range points {
		if p.Epsilon >= 0 && p.Epsilon <= 700 && p.Delta >= 0 && p.Delta <= 1 {
			ls = append(ls, line{math.Exp(p.Epsilon), p.Delta})
		}
	}
	return func(x float64) float64 {
		if !(x > 0) {
			return 0
		}
		x = min(x, 1)
		g := 0.0
		for _, l := range ls {
			g = max(g, 1-l.delta-l.e*(1-x)-profileSlack, (x-l.delta)/l.e-profileSlack)
		}
		return g
	}
}

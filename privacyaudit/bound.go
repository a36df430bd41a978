package privacyaudit

import (
	"fmt"
	"math"
)

// Tolerance is the grid of EpsilonLowerBound and Ceiling: they return a
// multiple of it (2⁻³⁰ ≈ 9.3e-10).
const Tolerance = 0x1p-30

// maxGridSteps bounds the search: ε = 2¹⁰ = 1024 makes e^{−ε} underflow,
// q = 1 in float64 and every p-value 1, so no larger ε is ever rejected.
const maxGridSteps = 1 << 40

// PValue returns the p-value of v correct guesses out of r, among m
// canaries, under the hypothesis that the mechanism is (ε, δ)-DP: an
// upper bound on P[W ≥ v] for the number W of correct guesses. It is
// Theorem 3.1 of Steinke, Nasr and Jagielski, "Privacy Auditing with One
// (1) Training Run" (NeurIPS 2023, arXiv 2305.08846), as its Appendix D
// computes it (p_value_DP_audit):
//
//	q = e^ε/(1+e^ε),  f(w) = P[Binomial(r, q) ≥ w],
//	p = min(1, f(v) + 2·m·δ · max_{1≤i≤v} (f(v−i) − f(v))/i).
//
// For δ = 0 it is the binomial tail alone. The terms are computed in log
// space as in BinomialTail, with the same relative error bound (the max
// adds nothing). It returns ErrInvalid for r < 1, r > m, r > MaxGuesses,
// v outside [0, r], ε NaN or negative, δ NaN or outside [0, 1).
func PValue(m, r, v int, eps, delta float64) (float64, error) {
	if err := checkCounts(m, r, v); err != nil {
		return 0, err
	}
	if err := checkDelta(delta); err != nil {
		return 0, err
	}
	if !(eps >= 0) {
		return 0, fmt.Errorf("%w: ε = %v, want ε ≥ 0", ErrInvalid, eps)
	}
	return math.Exp(logPValue(m, r, v, eps, delta)), nil
}

// EpsilonLowerBound returns the empirical lower bound on ε at confidence
// 1−β: the largest ε, to within Tolerance, that the test of PValue rejects
// at level β (p-value < β), given v correct guesses out of r among m
// canaries, each included independently with probability ½, and the
// mechanism's δ. It is 0 when not even ε = 0 is rejected. This is the
// search of the paper's Appendix D (get_eps_audit), on a fixed grid.
//
// Validity (Theorem 3.1): if the mechanism is (ε₀, δ)-DP and the r
// guesses were fixed in number before the scores were seen, the result
// exceeds ε₀ with probability at most β. This holds for any result ε̂
// whose p-value is below β, so it needs no monotonicity: an (ε₀, δ)-DP
// mechanism is (ε', δ)-DP for every ε' ≥ ε₀, so B(w) = inf_{ε'≥ε₀}
// PValue(w, ε') bounds P[W ≥ w] for every w; with w* the least w where
// B(w) < β, {ε̂ > ε₀} ⊆ {B(W) < β} ⊆ {W ≥ w*}, of probability at most
// B(w*) < β.
//
// The search: the result is k·Tolerance for the largest integer k the
// bisection finds with p-value(k·Tolerance) < β, bracketed by doubling
// from ε = 1. When 2mδ ≤ 1 the p-value is nondecreasing in ε and
// nonincreasing in v (derivation in the package doc), so the result is
// ⌊ε*/Tolerance⌋·Tolerance for the supremum ε* of the rejected ε (up to
// the p-value's rounding) and nondecreasing in v; beyond 2mδ = 1 the
// tests check both.
//
// It returns ErrInvalid for r < 1, r > m, r > MaxGuesses, v outside
// [0, r], δ NaN or outside [0, 1), β NaN or outside (0, 1).
func EpsilonLowerBound(m, r, v int, delta, beta float64) (float64, error) {
	if err := checkCounts(m, r, v); err != nil {
		return 0, err
	}
	if err := checkDelta(delta); err != nil {
		return 0, err
	}
	if !(beta > 0 && beta < 1) {
		return 0, fmt.Errorf("%w: β = %v, want 0 < β < 1", ErrInvalid, beta)
	}
	logBeta := math.Log(beta)
	rejects := func(k int64) bool {
		return logPValue(m, r, v, float64(k)*Tolerance, delta) < logBeta
	}
	if !rejects(0) {
		return 0, nil
	}
	// At ε = 1024 every p-value is 1 ≥ β: the search's cap is unreachable.
	return gridSup(rejects), nil
}

// gridSup returns k·Tolerance for the largest grid step k at which holds,
// a predicate that is true at 0 and false from some step on: doubling from
// ε = 1 (2³⁰ steps) up to maxGridSteps (which it returns if holds is
// still true there), then bisection. It is exact on the grid for a
// monotone predicate; for any other, its result holds and the next step
// does not.
func gridSup(holds func(int64) bool) float64 {
	lo, hi := int64(0), int64(1)<<30 // holds(lo)
	for holds(hi) {
		lo = hi
		if hi >= maxGridSteps {
			return float64(lo) * Tolerance
		}
		hi *= 2
	}
	for hi-lo > 1 { // holds(lo) && !holds(hi)
		mid := lo + (hi-lo)/2
		if holds(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return float64(lo) * Tolerance
}

// Ceiling returns the largest ε that r guesses among m canaries can
// certify at confidence 1−β and the mechanism's δ: the bound when all r
// guesses are correct, EpsilonLowerBound(m, r, r, δ, β). No audit with r
// guesses reports more, however leaky the mechanism; a ledger ε above the
// ceiling cannot be confirmed by it. For δ = 0 it is, to within Tolerance,
// the closed form ln(β^{1/r}/(1−β^{1/r})), since the p-value is q^r. It
// returns the errors of EpsilonLowerBound.
func Ceiling(m, r int, delta, beta float64) (float64, error) {
	return EpsilonLowerBound(m, r, r, delta, beta)
}

// logPValue returns ln PValue(m, r, v, ε, δ) for valid arguments. It
// works in logs throughout, so a p-value of 1e-300 compares correctly with
// a β of 1e-300.
func logPValue(m, r, v int, eps, delta float64) float64 {
	if v == 0 {
		return 0 // f(0) = 1
	}
	// ln q = −ln(1+e^{−ε}), ln(1−q) = −ε + ln q, both without cancellation.
	lp := -math.Log1p(math.Exp(-eps))
	b := newBinom(r, math.Exp(lp), lp, -eps+lp)
	logTail := b.logSum(v, r)
	if delta == 0 {
		return min(logTail, 0)
	}
	logC := math.Log(2*float64(m)) + math.Log(delta)
	return min(logAddExp(logTail, logC+b.logAlpha(v)), 0)
}

// logAlpha returns ln max_{1≤i≤v} S_i/i, S_i = P[v−i ≤ W ≤ v−1] =
// f(v−i) − f(v), for 1 ≤ v ≤ r: the δ term's factor in Theorem 3.1, the
// running maximum of Appendix D's loop. It walks j = v−1, v−2, …, 0 adding
// P[W = j] to S in log space, and stops once past the mode with the
// remaining terms below 2⁻⁶⁰·S (see negligible): from then on S_{i'} ≤
// S_i·(1+2⁻⁶⁰) and i' > i, so S_{i'}/i' < S_i/i and the maximum is found.
func (b binom) logAlpha(v int) float64 {
	best := math.Inf(-1)
	logS := math.Inf(-1)
	for j := v - 1; j >= 0; j-- {
		t := b.logPMF(j)
		logS = logAddExp(logS, t)
		i := v - j
		best = max(best, logS-math.Log(float64(i)))
		if j > 0 && negligible(math.Exp(t-logS), b.logDown(j), 1) {
			break
		}
	}
	return best
}

// logAddExp returns ln(e^x + e^y) without overflow.
func logAddExp(x, y float64) float64 {
	if math.IsInf(x, -1) {
		return y
	}
	if math.IsInf(y, -1) {
		return x
	}
	hi, lo := max(x, y), min(x, y)
	return hi + math.Log1p(math.Exp(lo-hi))
}

func checkCounts(m, r, v int) error {
	switch {
	case r < 1 || r > m:
		return fmt.Errorf("%w: r = %d guesses among m = %d canaries, want 1 ≤ r ≤ m", ErrInvalid, r, m)
	case r > MaxGuesses:
		return fmt.Errorf("%w: r = %d guesses, want at most MaxGuesses = %d", ErrInvalid, r, MaxGuesses)
	case v < 0 || v > r:
		return fmt.Errorf("%w: v = %d correct guesses out of r = %d, want 0 ≤ v ≤ r", ErrInvalid, v, r)
	}
	return nil
}

func checkDelta(delta float64) error {
	if !(delta >= 0 && delta < 1) {
		return fmt.Errorf("%w: δ = %v, want 0 ≤ δ < 1", ErrInvalid, delta)
	}
	return nil
}

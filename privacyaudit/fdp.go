package privacyaudit

import (
	"fmt"
	"math"
)

// The f-DP analysis of the one-run audit: Mahloujifar, Melis and
// Chaudhuri, "Auditing f-Differential Privacy in One Run" (arXiv
// 2410.22235, ICML 2025). The guessing game is the one of Guess and
// EpsilonLowerBound (m canaries, each included with probability ½; k = r
// guesses, v right); what changes is the hypothesis tested: "the mechanism
// is f-DP" for a trade-off function f, here μ-GDP, f = G_μ with G_μ(x) =
// Φ(Φ⁻¹(1−x) − μ) (Dong, Roth and Su, "Gaussian Differential Privacy",
// 2019/2022), instead of "(ε, δ)-DP". The whole curve constrains
// the count of correct guesses, not only its (ε, δ) corner, which is what
// makes the bound tighter for Gaussian-like mechanisms.
//
// # The bound (derived here; the recursion is the authors')
//
// Only the paper's abstract could be read from this machine, so the
// statement below is derived from first principles; its recursion is the
// one of the authors' reference implementation (facebookresearch/
// PrivacyGuard, privacy_guard/analysis/mia/fdp_analysis_node.py,
// FDPAnalysisNode; read, not copied), with one relaxation that makes it
// provable here (step 3). Theorem numbers are not cited because they
// could not be checked.
//
//  1. Lemma. Let W be the number of correct guesses and u_w = P[W = w].
//     Draw a canary I uniformly from the m. For 1 ≤ i ≤ k let
//     r_i = P[guess on I right, W ≥ i] = Σ_{w≥i} u_w·w/m and
//     h_{i−1} = P[guess on I wrong, W ≥ i−1] = Σ_{w≥i−1} u_w·(k−w)/m.
//     Given I and the other canaries' coins, the event "guess +1 on I and
//     at least i−1 right among the others" is a function of the output,
//     so it is a test between canary I in and out (neighbouring datasets);
//     f-DP gives P_in[event] ≤ 1 − f(P_out[event]), likewise for guess −1
//     with the roles swapped (G_μ is symmetric). Averaging over I, the
//     other coins and I's own coin, with 1 − f concave: r_i ≤ 1 − f(h_{i−1}),
//     i.e. h_{i−1} ≥ g(r_i) with g(x) = f(1 − x) = Φ(Φ⁻¹(x) − μ).
//  2. If P[W ≥ v] ≥ τ then r_v ≥ τ·v/m (every w ≥ v has w/m ≥ v/m) and
//     K = r_v − w_{v−1}·h_v ≥ τk/(m(k−v+1)), with w_i = i/(k−i): K is
//     r_v + h_v times ρ(1 + w_{v−1}) − w_{v−1}, ρ = r_v/(r_v + h_v) ≥ v/k,
//     which grows with both factors and is positive at the corner.
//  3. Summation by parts turns r_{i} = r_{i+1} + w_i·(h_i − h_{i+1}) (the
//     definitions) into r_i = K + w_i·h_i + Σ_{j=i+1}^{v−1} (w_j − w_{j−1})·h_j
//     for i < v, every coefficient ≥ 0. So the sequence computed by
//     h_{v−1} = g(r_v), h_i = max(h_{i+1}, g(r_{i+1})), r_i by that sum, from
//     the corner r_v = τv/m and K = τk/(m(k−v+1)), is below the true one at
//     every i (induction down from v; g is nondecreasing), and so is
//     s_0 = r_0 + h_0. The true s_0 is Σ_w u_w·k/m = k/m. Hence: if the
//     computed s_0 exceeds k/m, then P[W ≥ v] < τ for every μ-GDP
//     mechanism. (The reference implementation also keeps h_v =
//     τ(k−v)/m inside the first max; the true h_v may be smaller, so this
//     code drops it: a bound no larger, and proved.)
//
// GDPRejects is that test at τ = β. GDPLowerBound returns the largest μ
// it rejects: valid at confidence 1−β whatever the shape of the test in v
// (the argument of EpsilonLowerBound's doc: a μ₀-GDP mechanism is μ'-GDP
// for every μ' ≥ μ₀, and the least v rejected by some μ' ≥ μ₀ has tail
// below β). The test is monotone in μ (g falls as μ grows, and the
// computed s_0 is nondecreasing in g by step 3), so the bisection finds
// the supremum of the rejected μ to within Tolerance.
//
// What the μ means: "the mechanism is not μ'-GDP for any μ' below it",
// at confidence 1−β. GDPEpsilon reports it as the ε at the run's δ of
// the μ-GDP curve (Dong, Roth and Su, Cor. 2.13). That ε is the ε of a
// Gaussian curve, not of the mechanism's own curve: a mechanism that is
// not μ-GDP need not fail (ε_μ(δ), δ)-DP (its curve may dip below G_μ in
// one place and lie above the (ε_μ(δ), δ) corner). docs/PRIVACY.md
// discusses what this means for the exit status of audit-privacy.
//
// # Numerical error
//
// The test never rejects a μ that exact arithmetic accepts: every
// quantity of the recursion is a sum or product of non-negative terms,
// nondecreasing in the ones before it (step 3), and is rounded downward
// (one ulp toward zero after each round-to-nearest operation); g is
// lowered by a relative 2⁻³⁰ (its own error, Φ by math.Erfc and Φ⁻¹ by
// math.Erfcinv refined by two Newton steps on math.Erfc, is a few hundred
// ulps at most, 2⁻⁴⁴ relative, over the range the tests check); and k/m
// is rounded upward. The price is a bound lower than the exact supremum
// by a relative 2⁻³⁰ of g, invisible at the Tolerance grid in the tests.

// maxGDP bounds what GDPLowerBound returns (its search stops there): at μ = 64, g(x) ≤ Φ(Φ⁻¹(1) −
// 64) is 0 for every x < 1 in float64, so s_0 = τk/m ≤ k/m and no μ ≥ 64
// is rejected.
const maxGDP = 64

// gdpTradeoffSafety is the relative amount g is lowered by (see the
// numerical error above).
const gdpTradeoffSafety = 0x1p-30

// normCDF returns Φ(x) = ½·erfc(−x/√2): relative error a few ulps, also
// deep in the lower tail (math.Erfc ports FreeBSD's s_erf.c).
func normCDF(x float64) float64 {
	return 0.5 * math.Erfc(-x/math.Sqrt2)
}

// normQuantile returns Φ⁻¹(p) for p in (0, 1): math.Erfcinv's value
// (which loses relative accuracy for small p, as it computes
// Erfinv(1 − 2p)) refined by two Newton steps on Φ(x) = p, whose
// relative error is a few ulps. ±Inf at 0 and 1.
func normQuantile(p float64) float64 {
	switch {
	case p <= 0:
		return math.Inf(-1)
	case p >= 1:
		return math.Inf(1)
	}
	x := -math.Sqrt2 * math.Erfcinv(2*p)
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return x
	}
	for range 2 {
		// φ(x) = e^{−x²/2}/√(2π); the step is (Φ(x) − p)/φ(x).
		d := math.Exp(-x*x/2) / math.Sqrt(2*math.Pi)
		if d == 0 {
			break
		}
		x -= (normCDF(x) - p) / d
	}
	return x
}

// gdpInverseTradeoff returns g(x) = G_μ(1 − x) = Φ(Φ⁻¹(x) − μ), the least
// h the lemma allows below an r of x, lowered by gdpTradeoffSafety so that
// it is at most the exact value: 0 for x ≤ 0, 1 for x ≥ 1 (then it is
// exact).
func gdpInverseTradeoff(x, mu float64) float64 {
	if x >= 1 {
		return 1
	}
	return down(gdpInverseTradeoffNearest(x, mu) * (1 - gdpTradeoffSafety))
}

// gdpInverseTradeoffNearest is g(x) with a relative error of at most 2⁻⁴⁴
// over the tests' range (0 for x ≤ 0, 1 for x ≥ 1); above ½ it works
// from 1 − x, which is exact there, so x near 1 keeps its digits.
func gdpInverseTradeoffNearest(x, mu float64) float64 {
	switch {
	case x <= 0:
		return 0
	case x >= 1:
		return 1
	}
	var q float64
	if x <= 0.5 {
		q = normQuantile(x)
	} else {
		q = -normQuantile(1 - x)
	}
	if math.IsInf(q, -1) {
		return 0
	}
	return normCDF(q - mu)
}

// down returns x one ulp toward zero: after a round-to-nearest operation
// on non-negative exact inputs (error at most half an ulp), a value at
// most the exact result.
func down(x float64) float64 {
	if x <= 0 {
		return 0
	}
	return math.Nextafter(x, 0)
}

// GDPRejects reports whether v correct guesses out of r (= k in the
// derivation above), among m canaries, reject at level β the hypothesis
// that the mechanism is μ-GDP: the recursion of the derivation above, with
// its rounding directed so that a rejection is one exact arithmetic makes
// too. It returns ErrInvalid for the counts of EpsilonLowerBound, μ NaN or
// negative, β outside (0, 1).
func GDPRejects(m, r, v int, mu, beta float64) (bool, error) {
	if err := checkCounts(m, r, v); err != nil {
		return false, err
	}
	if !(mu >= 0) {
		return false, fmt.Errorf("%w: μ = %v, want μ ≥ 0", ErrInvalid, mu)
	}
	if !(beta > 0 && beta < 1) {
		return false, fmt.Errorf("%w: β = %v, want 0 < β < 1", ErrInvalid, beta)
	}
	return gdpRejects(m, r, v, mu, beta), nil
}

// gdpRejects is GDPRejects for valid arguments: the recursion of
// curveRejects (privacyaudit/curve.go) with g = G_μ(1 − x).
func gdpRejects(m, k, v int, mu, tau float64) bool {
	return curveRejects(m, k, v, func(x float64) float64 { return gdpInverseTradeoff(x, mu) }, tau)
}

// GDPLowerBound returns the empirical lower bound on μ at confidence 1−β:
// the largest μ, a multiple of Tolerance, that GDPRejects rejects, or 0
// when not even μ = 0 (a mechanism whose output ignores the canaries) is
// rejected. The derivation above gives its validity and monotonicity in
// μ. It returns the errors of GDPRejects.
func GDPLowerBound(m, r, v int, beta float64) (float64, error) {
	if _, err := GDPRejects(m, r, v, 0, beta); err != nil {
		return 0, err
	}
	rejects := func(k int64) bool { return gdpRejects(m, r, v, float64(k)*Tolerance, beta) }
	if !rejects(0) {
		return 0, nil
	}
	// gridSup's doubling stops by μ = maxGDP, which is never rejected.
	return gridSup(rejects), nil
}

// GDPDelta returns δ_μ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2), the least
// δ at which μ-GDP implies (ε, δ)-DP (Dong, Roth and Su, Cor. 2.13), for
// μ > 0 and ε ≥ 0; the second term is computed as exp(ε + ln Φ(·)) so
// it neither overflows nor underflows early. Relative error: a few ulps
// in each term, amplified by the cancellation between them, at most by
// the factor 1 + |ε/μ − μ/2|/μ (the terms' ratio tends to that); the
// tests compare with 50-digit values.
func GDPDelta(mu, eps float64) float64 {
	a := -eps/mu + mu/2
	t1 := normCDF(a)
	p := normCDF(a - mu)
	if p == 0 {
		return t1
	}
	return max(0, t1-math.Exp(eps+math.Log(p)))
}

// GDPEpsilon returns the ε at δ of the μ-GDP curve: the least ε ≥ 0 with
// δ_μ(ε) ≤ δ (GDPDelta), a multiple of Tolerance rounded down (the largest
// grid ε whose δ_μ is above δ, plus nothing), so it is at most the exact
// value and within Tolerance of it, up to GDPDelta's error. It is 0 for
// μ = 0 and whenever δ_μ(0) ≤ δ. It returns ErrInvalid for μ NaN,
// negative or infinite, δ outside (0, 1) (at δ = 0 every μ > 0 has
// ε = ∞).
func GDPEpsilon(mu, delta float64) (float64, error) {
	if !(mu >= 0) || math.IsInf(mu, 0) {
		return 0, fmt.Errorf("%w: μ = %v, want 0 ≤ μ < ∞", ErrInvalid, mu)
	}
	if !(delta > 0 && delta < 1) {
		return 0, fmt.Errorf("%w: δ = %v, want 0 < δ < 1", ErrInvalid, delta)
	}
	if mu == 0 {
		return 0, nil
	}
	above := func(k int64) bool { return GDPDelta(mu, float64(k)*Tolerance) > delta }
	if !above(0) {
		return 0, nil
	}
	return gridSup(above), nil
}

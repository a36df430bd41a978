package accounting

import "math"

// This file extends the PLD accountant (accounting/pld.go) from the Gaussian
// to the discrete Gaussian mechanism the leader runs by default
// (mechanism.DiscreteGaussian, docs/PRIVACY.md items 8 and 12): an integer
// vector k ∈ ℤᵈ whose neighbouring values differ by at most Δ in L2, plus
// z ~ N_ℤ(0, s²)ᵈ, the noise multiplier being σ = s/Δ.
//
// # The bound
//
// Compare it with the mechanism that releases k + round(Y), Y ~ N(0, s²)ᵈ
// rounded coordinatewise. That is post-processing of the Gaussian
// mechanism k + Y (L2 sensitivity Δ, noise s), so its privacy profile, and
// after Poisson subsampling and composition its PLD, is the continuous
// Gaussian's at σ = s/Δ, which accounting/pld.go bounds. The two mechanisms'
// outputs are close: for every k, the total variation distance between
// k + z and k + round(Y) is at most η = d·τ(s), τ(s) the one-coordinate
// distance bounded by DiscreteGaussianTV (independent coordinates: TV is
// subadditive over products). Poisson subsampling mixes both with the same
// weights, which keeps them within η, and T adaptive steps are within T·η
// (a hybrid argument: swap the steps one at a time, each swap costs at most
// the largest per-step distance). So for every event S and neighbouring
// D, D', with A the discrete run, A' the rounded-Gaussian run,
//
//	P[A(D) ∈ S] ≤ P[A'(D) ∈ S] + Tη ≤ e^ε·P[A'(D') ∈ S] + δ'(ε) + Tη
//	            ≤ e^ε·P[A(D') ∈ S] + δ'(ε) + (1 + e^ε)·Tη,
//
// that is, the discrete run is (ε, δ'(ε) + (1 + e^ε)·Σ_steps η)-DP, with
// δ'(ε) the Gaussian's privacy profile at σ. The accountant reports the
// smallest ε it can certify with δ'(ε) ≤ δ − (1 + e^ε)·Σ η (pldEpsilonSlack),
// in each adjacency direction. Nothing here is specific to the Gaussian's
// shape beyond what accounting/pld.go already proves, and nothing compares
// privacy curves of the two mechanisms: only their output distributions.
//
// What it costs: the leader's grid makes s ≥ σ·(2¹⁶ + 1)·√d
// (mechanism.GridFraction), so d·τ(s) ≤ 1/(24·σ²·(2¹⁶+1)²), about 2·10⁻¹¹ at
// σ = 0.7: for the README's main job (1000 steps, ε = 3) the slack is
// 1.1·10⁻⁷ of its δ = 10⁻⁵, and ε moves in the fourth digit. For small
// lattices (s of a few units) τ is large and the bound is useless; the
// accountant then falls back to the RDP bound of the discrete Gaussian
// (SubsampledDiscreteGaussianRDP), as it does whenever the PLD window cannot
// bracket the answer.

// DiscreteGaussianTV returns an upper bound on the total variation
// distance between the discrete Gaussian N_ℤ(0, s²) and the rounded
// Gaussian round(N(0, s²)), for s ≥ 1; it is about 1/(24·s²) for large s
// and +Inf for s < 1 or s not finite.
//
// Derivation. Let φ be the N(0, s²) density and θ(t) = Σ_{n∈ℤ} φ(n + t),
// which by Poisson summation is 1 + 2·Σ_{k≥1} e^{−2π²s²k²}·cos(2πkt).
// The two probability mass functions at n ∈ ℤ are
//
//	p(n) = φ(n)/θ(0),   r(n) = ∫_{n−½}^{n+½} φ = φ(n)·I(n),
//	I(n) = ∫_{−½}^{½} e^{−u²/(2s²)}·cosh(nu/s²) du
//
// (the odd part of e^{−nu/s²} integrates to 0). Bounds on I:
// I(n) ≥ ∫(1 − u²/(2s²)) du = 1 − 1/(24s²); and, with x = n/(2s²),
// I(n) ≤ ∫cosh(nu/s²) du = sinh(x)/x ≤ 1 + (x²/6)·cosh(x) (compare the
// series term by term: 6·(2k−2)! ≤ (2k+1)!). So
// |I(n) − 1| ≤ 1/(24s²) + n²·cosh(n/(2s²))/(24s⁴), and with
// ε_θ = θ(0) − 1 ≤ 2e^{−2π²s²}/(1 − e^{−2π²s²}),
//
//	TV = ½·Σ φ(n)·|1/θ(0) − I(n)|
//	   ≤ ½·[ε_θ + θ(0)/(24s²) + Σ φ(n)·n²·cosh(n/(2s²))/(24s⁴)].
//
// The last sum is Σ φ(n)·n²·e^{n/(2s²)} (symmetry) = e^{1/(8s²)}·Σ n²·φ(n−½)
// (complete the square), and Σ n²·φ(n−½) = Σ_{m∈ℤ+½} (m² + m + ¼)·φ(m) =
// s⁴θ”(½) + s²θ(½) + θ(½)/4 (φ” = φ·(x²/s⁴ − 1/s²); the odd term
// vanishes), where θ(½) ≤ 1 and θ”(½) = 8π²e^{−2π²s²} − 32π²e^{−8π²s²} + …
// ≤ 8π²e^{−2π²s²} (alternating, decreasing terms for s ≥ 1). Hence
//
//	TV ≤ ½·[ε_θ + (1 + ε_θ)/(24s²) + e^{1/(8s²)}·(s² + ¼ + 8π²s⁴e^{−2π²s²})/(24s⁴)].
//
// Numeric error: a handful of correctly rounded operations on positive
// terms, relative error below 1e-14; the result is scaled up by 1 + 1e-12
// so that it stays an upper bound. TestDiscreteGaussianTVBound checks it
// against the exact distance summed numerically (the bound is about twice
// the exact value: E|n²/s² − 1|/(48s²) ≈ 1/(49.6·s²)).
func DiscreteGaussianTV(s float64) float64 {
	if !(s >= 1) || math.IsInf(s, 1) {
		return math.Inf(1)
	}
	s2 := s * s
	e := math.Exp(-2 * math.Pi * math.Pi * s2)
	epsTheta := 2 * e / (1 - e)
	sum := math.Exp(1/(8*s2)) * (s2 + 0.25 + 8*math.Pi*math.Pi*s2*s2*e) / (24 * s2 * s2)
	tv := 0.5 * (epsTheta + (1+epsTheta)/(24*s2) + sum)
	return tv * (1 + 1e-12)
}

// latticeTV returns Σ count·d·τ(s) over the discrete events (PLDEvent with
// a Dimension): the total variation distance, over the whole composition,
// between the discrete run and its rounded-Gaussian twin (the file
// comment). Continuous events contribute 0.
func latticeTV(events []PLDEvent) float64 {
	t := 0.0
	for _, e := range events {
		if e.Dimension > 0 {
			t += float64(e.Count) * float64(e.Dimension) * DiscreteGaussianTV(e.LatticeScale)
		}
	}
	return t
}

// pldEpsilonSlack returns the smallest ε it can certify with
// δ'(ε) + (1 + e^ε)·tv ≤ delta, where δ'(ε) is the composed PLD's privacy
// profile (solve gives the smallest ε with δ'(ε) ≤ d, ok = false if it
// cannot), or ok = false. Any returned ε satisfies the inequality exactly
// as solve's results do: it is solve(δ − (1 + e^u)·tv) for a u at or above
// it, and δ − (1 + e^ε)·tv only grows as ε falls.
func pldEpsilonSlack(solve func(d float64) (float64, bool), delta, tv float64) (float64, bool) {
	u, ok := solve(delta) // a lower bound on the answer
	if !ok {
		return 0, false
	}
	if tv == 0 {
		return u, true
	}
	for range 8 {
		d := delta - (1+math.Exp(u))*tv
		if !(d > 0) {
			return 0, false
		}
		e, ok := solve(d)
		if !ok {
			return 0, false
		}
		if e <= u {
			return e, true
		}
		// The map u ↦ solve(δ − (1 + e^u)·tv) moves little (tv is tiny
		// where this is useful): overshoot the last move so the next
		// guess lies above the fixed point.
		u = e + 2*(e-u) + 1e-12*math.Abs(e)
	}
	return 0, false
}

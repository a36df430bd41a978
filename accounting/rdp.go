package accounting

import (
	"fmt"
	"math"
	"slices"
)

// OpacusOrders returns the Rényi orders of Opacus's RDPAccountant
// (DEFAULT_ALPHAS in opacus/accountants/rdp.py): 1.1 to 10.9 by 0.1, then the
// integers 12 to 63. The conformance vectors were computed on these orders.
func OpacusOrders() []float64 {
	orders := make([]float64, 0, 99+52)
	for x := 1; x < 100; x++ {
		orders = append(orders, 1+float64(x)/10)
	}
	for a := 12; a < 64; a++ {
		orders = append(orders, float64(a))
	}
	return orders
}

// DefaultOrders returns the orders the accountant uses unless told
// otherwise: a superset of OpacusOrders that adds orders close to 1 (for
// large ε), 11 (the gap in Opacus's grid) and large integer orders up to 1024
// (for small ε, many steps or large σ). Every order yields a valid bound, and
// ε is the minimum over orders, so more orders can only lower ε.
func DefaultOrders() []float64 {
	orders := []float64{1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08, 1.09}
	orders = append(orders, OpacusOrders()...)
	orders = append(orders, 11)
	for _, a := range []float64{64, 72, 80, 96, 112, 128, 160, 192, 256, 320, 384, 512, 768, 1024} {
		orders = append(orders, a)
	}
	slices.Sort(orders)
	return orders
}

// SubsampledGaussianRDP returns the Rényi DP of order alpha of one run of the
// Poisson-subsampled Gaussian mechanism with sampling rate q and noise
// multiplier sigma, under add/remove-one adjacency.
//
// This is the bound of Mironov, Talwar and Zhang, "Rényi Differential Privacy
// of the Sampled Gaussian Mechanism" (2019): RDP(α) = log(A_α)/(α−1), with
// A_α computed by Section 3.3's closed form for integer α and by the
// numerically stable series of Section 3.4 for fractional α. The
// implementation follows the structure of Opacus's analysis/rdp.py and
// tensorflow_privacy's rdp_accountant so that results agree with them.
//
// Special cases: q = 1 is the plain Gaussian mechanism, RDP(α) = α/(2σ²)
// (Mironov 2017, Prop. 7).
func SubsampledGaussianRDP(q, sigma, alpha float64) float64 {
	switch {
	case q == 0:
		return 0
	case sigma == 0 || math.IsInf(alpha, 1):
		return math.Inf(1)
	case q == 1:
		return alpha / (2 * sigma * sigma)
	}
	var logA float64
	if alpha == math.Trunc(alpha) {
		logA = logAInt(q, sigma, int(alpha))
	} else {
		logA = logAFrac(q, sigma, alpha)
	}
	return logA / (alpha - 1)
}

// SubsampledDiscreteGaussianRDP returns an upper bound on the Rényi DP of
// order alpha of one run of the Poisson-subsampled discrete Gaussian
// mechanism with sampling rate q and noise multiplier sigma (noise scale s
// over L2 sensitivity Δ, both in lattice units), under add/remove-one
// adjacency. It equals SubsampledGaussianRDP at integer orders and at q = 1,
// and lies above it at fractional orders.
//
// The argument. Fix the other records' sample; the snapped sums without
// and with the added record are integer vectors k0 and k1 with
// ‖k1 − k0‖₂ ≤ Δ. The outputs are P0 = N_Z(k0, s²I) and the mixture
// P = (1−q)P0 + qP1, P1 = N_Z(k1, s²I); averaging over the other records
// only lowers the divergence (joint convexity of exp((α−1)D_α), as for the
// continuous Gaussian in Mironov, Talwar, Zhang 2019, "Rényi Differential
// Privacy of the Sampled Gaussian Mechanism", Sec. 3). With L = P1/P0:
//
//   - D_α(P‖P0): A_α = E_P0[(1−q+qL)^α]. For integer α the binomial
//     expansion A_α = Σ_i C(α,i)(1−q)^{α−i} q^i E_P0[L^i] has non-negative
//     coefficients, and E_P0[L^i] = exp((i−1)D_i(P1‖P0)). Per coordinate,
//     for integers μ, ν and real α > 1 (Canonne, Kamath, Steinke 2020,
//     Sec. 2): Σ_x N_Z(μ,s²)(x)^α N_Z(ν,s²)(x)^{1−α} =
//     exp(α(α−1)(μ−ν)²/(2s²))·θ(αμ+(1−α)ν)/θ(0), θ(c) = Σ_{x∈ℤ}
//     e^{−(x−c)²/(2s²)}, which is 1-periodic and largest at integers
//     (Poisson summation). So D_α ≤ α(μ−ν)²/(2s²) for every α ≥ 1, with
//     equality at integer α; coordinates are independent, so divergences
//     add. Hence A_α at integer α is exactly the continuous Gaussian's at
//     noise multiplier s/‖k1−k0‖ ≥ sigma, and the closed form of Mironov
//     et al. 2019, Sec. 3.3 (logAInt) bounds it.
//   - Fractional α: the expansion has signed coefficients and no termwise
//     comparison is known, so we do not claim the Gaussian's series
//     (logAFrac). Instead log A_α is convex in α (Hölder), so it lies below
//     the chord between the neighbouring integer orders ⌊α⌋ and ⌈α⌉, where
//     it is known exactly; A_1 = 1. This is the conservative part.
//   - D_α(P0‖P): B_α = E_P0[(1−q+qL)^{1−α}]. The reflection z ↦ k0+k1−z
//     maps P0 to P1, so under P0 the law of L tilted by L is the law of
//     1/L. Splitting E_P0 at L = 1 gives A_α − B_α = E_P0[Ψ(L); L > 1] with
//     Ψ(ℓ) = T(α) − T(1−α), T(β) = u^β + ℓv^β, u = 1−q+qℓ, v = 1−q+q/ℓ.
//     Writing β = ½+x, T(β) − T(1−β) = 2 sinh(xb)(√u·r(x) − ℓ√v) with
//     b = −ln v, r(x) = sinh(x ln u)/sinh(xb), which increases in x since
//     ln u ≥ b (uv ≥ 1); it vanishes at x = ½ (α = 1), so Ψ ≥ 0 for α ≥ 1
//     and B_α ≤ A_α. The same holds for the continuous Gaussian, which is
//     why Gaussian accountants use A_α alone (Mironov et al. 2019, Sec. 3).
//
// Numeric error: logAInt's float64 sum has relative error about 1e-15 per
// term; it is the same computation the Gaussian accountant uses.
func SubsampledDiscreteGaussianRDP(q, sigma, alpha float64) float64 {
	// The Gaussian's value wherever it is the discrete Gaussian's bound:
	// q = 0; σ = 0 or α = ∞; no subsampling (q = 1: D_α ≤ α/(2σ²) at every
	// real α ≥ 1, above); and integer orders (the same closed form).
	if q == 0 || q == 1 || sigma == 0 || math.IsInf(alpha, 1) || alpha == math.Trunc(alpha) {
		return SubsampledGaussianRDP(q, sigma, alpha)
	}
	lo := math.Floor(alpha)
	theta := alpha - lo
	logLo := 0.0 // log A_1 = log E[1−q+qL] = 0
	if lo >= 2 {
		logLo = logAInt(q, sigma, int(lo))
	}
	logHi := logAInt(q, sigma, int(lo)+1)
	return ((1-theta)*logLo + theta*logHi) / (alpha - 1)
}

// logAInt computes log(A_α) for integer α (Mironov et al. 2019, Sec. 3.3):
//
//	A_α = Σ_{i=0}^{α} C(α,i) q^i (1−q)^{α−i} exp((i²−i)/(2σ²)).
func logAInt(q, sigma float64, alpha int) float64 {
	logA := math.Inf(-1)
	lq, l1q := math.Log(q), math.Log1p(-q)
	for i := 0; i <= alpha; i++ {
		fi := float64(i)
		coef := logBinom(float64(alpha), fi) + fi*lq + float64(alpha-i)*l1q
		logA = logAdd(logA, coef+(fi*fi-fi)/(2*sigma*sigma))
	}
	return logA
}

// logAFrac computes log(A_α) for fractional α by the two-sided series of
// Mironov et al. 2019, Sec. 3.4, with z0 = σ² log(1/q − 1) + 1/2. The series
// is summed past i = α until both terms fall below e^−30 (Opacus and
// tensorflow_privacy stop at the first such terms, which at large α with
// large q come before the peak, and so dropped the whole sum: −0.50 for
// the RDP at q = ½, σ = 16, α = 100.5, where the truth is about 0.054;
// TestFractionalRDPNeverBelowItsIntegerNeighbour).
func logAFrac(q, sigma, alpha float64) float64 {
	logA0, logA1 := math.Inf(-1), math.Inf(-1)
	z0 := sigma*sigma*math.Log(1/q-1) + 0.5
	lq, l1q := math.Log(q), math.Log1p(-q)
	for i := 0.0; ; i++ {
		logCoef, positive := logAbsBinom(alpha, i)
		j := alpha - i
		logT0 := logCoef + i*lq + j*l1q
		logT1 := logCoef + j*lq + i*l1q
		logE0 := math.Log(0.5) + logErfc((i-z0)/(math.Sqrt2*sigma))
		logE1 := math.Log(0.5) + logErfc((z0-j)/(math.Sqrt2*sigma))
		logS0 := logT0 + (i*i-i)/(2*sigma*sigma) + logE0
		logS1 := logT1 + (j*j-j)/(2*sigma*sigma) + logE1
		if positive {
			logA0 = logAdd(logA0, logS0)
			logA1 = logAdd(logA1, logS1)
		} else {
			logA0 = logSub(logA0, logS0)
			logA1 = logSub(logA1, logS1)
		}
		// A_α ≥ 1, so terms below e⁻³⁰ no longer matter, but only past
		// i = α: before it they may still be growing toward their peak.
		if i > alpha && math.Max(logS0, logS1) < -30 {
			break
		}
	}
	return logAdd(logA0, logA1)
}

// logBinom returns log C(n, k) for 0 ≤ k ≤ n.
func logBinom(n, k float64) float64 {
	a, _ := math.Lgamma(n + 1)
	b, _ := math.Lgamma(k + 1)
	c, _ := math.Lgamma(n - k + 1)
	return a - b - c
}

// logAbsBinom returns log|C(α, i)| and whether C(α, i) is positive, for the
// generalized binomial coefficient Γ(α+1)/(Γ(i+1)Γ(α−i+1)) with real α > 0
// and integer i ≥ 0. Its sign alternates once i exceeds α.
func logAbsBinom(alpha, i float64) (float64, bool) {
	a, _ := math.Lgamma(alpha + 1)
	b, _ := math.Lgamma(i + 1)
	c, sign := math.Lgamma(alpha - i + 1)
	return a - b - c, sign > 0
}

// logAdd returns log(e^x + e^y) without overflow.
func logAdd(x, y float64) float64 {
	a, b := math.Min(x, y), math.Max(x, y)
	if math.IsInf(a, -1) {
		return b
	}
	return math.Log1p(math.Exp(a-b)) + b
}

// logSub returns log(e^x − e^y) for x ≥ y. The series of logAFrac only
// subtracts terms smaller than the running sum; if rounding ever makes y
// exceed x, the result is clamped to −∞ (the difference is below float64
// resolution).
func logSub(x, y float64) float64 {
	switch {
	case math.IsInf(y, -1):
		return x
	case x <= y:
		return math.Inf(-1)
	}
	d := math.Expm1(x - y)
	if math.IsInf(d, 1) {
		return x
	}
	return math.Log(d) + y
}

// logErfc returns log(erfc(x)), accurate where erfc underflows: for x > 25
// it uses the asymptotic series erfc(x) ≈ e^{−x²}/(x√π)·(1 − 1/(2x²) +
// 3/(4x⁴) − 15/(8x⁶)) (Abramowitz and Stegun 7.1.23), whose truncation error
// there is below 1e-12 relative.
func logErfc(x float64) float64 {
	if x < 25 {
		return math.Log(math.Erfc(x))
	}
	x2 := x * x
	series := 1 - 1/(2*x2) + 3/(4*x2*x2) - 15/(8*x2*x2*x2)
	return -x2 - math.Log(x) - 0.5*math.Log(math.Pi) + math.Log(series)
}

// RDPToEpsilon converts a Rényi DP curve to (ε, δ)-DP with the bound of
// Balle, Barthe, Gaboardi, Hsu and Sato, "Hypothesis Testing Interpretations
// and Renyi Differential Privacy" (AISTATS 2020), Theorem 21, as Opacus and
// dp_accounting do:
//
//	ε = RDP(α) + log((α−1)/α) − (log δ + log α)/(α−1),
//
// minimized over the orders. It returns ε and the order that attains it;
// ε is clamped at 0. rdp[i] belongs to orders[i]. Orders ≤ 1 are ignored.
func RDPToEpsilon(orders, rdp []float64, delta float64) (eps, order float64, err error) {
	if len(orders) != len(rdp) {
		return 0, 0, fmt.Errorf("%w: %d orders but %d RDP values", ErrInvalidParameter, len(orders), len(rdp))
	}
	if !(delta > 0 && delta < 1) {
		return 0, 0, fmt.Errorf("%w: delta %v must be in (0, 1)", ErrInvalidParameter, delta)
	}
	eps, order = math.Inf(1), math.NaN()
	logDelta := math.Log(delta)
	for i, a := range orders {
		if !(a > 1) || math.IsNaN(rdp[i]) {
			continue
		}
		e := rdp[i] + math.Log((a-1)/a) - (logDelta+math.Log(a))/(a-1)
		if e < eps {
			eps, order = e, a
		}
	}
	if math.IsInf(eps, 1) {
		return eps, order, nil
	}
	return math.Max(eps, 0), order, nil
}

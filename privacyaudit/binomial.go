package privacyaudit

import "math"

// MaxGuesses is the largest number of guesses r (and of trials in
// BinomialTail) this package accepts. It bounds the work of one p-value
// and keeps the error bound of BinomialTail (see its doc) near 1.3e-8
// relative at p = ½.
const MaxGuesses = 1 << 20

// truncation is the relative size below which the tail of a sum of
// binomial probabilities is dropped. Log-concavity of the binomial pmf
// turns it into a proof (see logSum), not a heuristic.
const truncation = 0x1p-60

// BinomialTail returns P[W ≥ v] for W ~ Binomial(r, p), computed exactly up
// to floating-point rounding: no normal or Poisson approximation. It
// returns 1 for v ≤ 0, 0 for v > r, and NaN for r < 0, r > MaxGuesses, or
// p NaN or outside [0, 1].
//
// Method: each term is computed in log space,
//
//	ln P[W = j] = lnΓ(r+1) − lnΓ(j+1) − lnΓ(r−j+1) + j·ln p + (r−j)·ln(1−p)
//
// (math.Lgamma, math.Log1p), and the terms are summed relative to the
// largest one (a log-sum-exp), so nothing overflows and a tail of 1e-300
// keeps its digits. The sum stops when the terms left are provably below
// 2⁻⁶⁰ of it: the pmf is log-concave, so past the mode the ratios
// P[W=j+1]/P[W=j] = (r−j)/(j+1) · p/(1−p) only fall and the rest is below a
// geometric series.
//
// Error bound: with u = 2⁻⁵³, L = max(|ln p|, |ln(1−p)|), P the result and
// n ≤ r+1 the number of terms summed, the relative error is at most
//
//	u·(8·lnΓ(r+1) + 6·r·L + |ln P| + n + 8)
//
// for P above the smallest normal float64 (2⁻¹⁰²²; a subnormal result
// keeps only its absolute accuracy). The derivation, assuming math.Lgamma
// within 2 ulps (as the FreeBSD code it ports claims): each log-term is a
// sum of five terms whose magnitudes add to at most 2·lnΓ(r+1) + r·L, so
// its absolute error is at most u·(8·lnΓ(r+1) + 6·r·L), which exp turns
// into the same relative error; adding n positive terms costs n·u; the
// final exp of ln P costs u·|ln P|; the truncation 2⁻⁵⁹ is below u. At
// r = 10⁴, p = ½ and P ≥ 1e-10 the bound is 1e-10; the tests compare with exact
// rational arithmetic and the errors they find are far below it. The
// result is capped at 1 (before, P[W ≥ 13] for Binomial(755, 1/7) came
// out 1 + 1.04·10⁻¹², within the bound but not a probability).
func BinomialTail(r, v int, p float64) float64 {
	switch {
	case r < 0 || r > MaxGuesses || math.IsNaN(p) || p < 0 || p > 1:
		return math.NaN()
	case v <= 0:
		return 1
	case v > r:
		return 0
	case p == 0:
		return 0
	case p == 1:
		return 1
	}
	b := newBinom(r, p, math.Log(p), math.Log1p(-p))
	// A tail near 1 may round above it (within the error bound): a
	// probability is at most 1, and the cap moves it toward the truth.
	return min(1, math.Exp(b.logSum(v, r)))
}

// binom is Binomial(r, p) with p in (0, 1), held in log form.
type binom struct {
	r      int
	p      float64 // P[success], for the mode
	lp, lq float64 // ln p and ln(1−p)
}

func newBinom(r int, p, lp, lq float64) binom {
	return binom{r: r, p: p, lp: lp, lq: lq}
}

// logPMF returns ln P[W = j] for 0 ≤ j ≤ r.
func (b binom) logPMF(j int) float64 {
	fr, fj := float64(b.r), float64(j)
	lr, _ := math.Lgamma(fr + 1)
	lj, _ := math.Lgamma(fj + 1)
	lk, _ := math.Lgamma(fr - fj + 1)
	return lr - lj - lk + fj*b.lp + (fr-fj)*b.lq
}

// logUp returns ln(P[W = j+1]/P[W = j]) for 0 ≤ j < r; it falls as j
// grows (log-concavity).
func (b binom) logUp(j int) float64 {
	return math.Log(float64(b.r-j)/float64(j+1)) + b.lp - b.lq
}

// logDown returns ln(P[W = j−1]/P[W = j]) for 0 < j ≤ r; it falls as j
// decreases.
func (b binom) logDown(j int) float64 {
	return math.Log(float64(j)/float64(b.r-j+1)) + b.lq - b.lp
}

// mode returns ⌊(r+1)p⌋ clamped to [0, r], a mode of the pmf (one of the
// two when (r+1)p is an integer; rounding may move it by one, which only
// costs a few more terms).
func (b binom) mode() int {
	m := math.Floor(float64(b.r+1) * b.p)
	return int(max(0, min(m, float64(b.r))))
}

// negligible reports whether the terms after one of relative size e, each
// at most ρ = exp(lr) times the one before it, sum to at most truncation
// times s: their sum is at most e·ρ/(1−ρ) when ρ < 1.
func negligible(e, lr, s float64) bool {
	return lr < 0 && e*math.Exp(lr) <= truncation*s*-math.Expm1(lr)
}

// logSum returns ln Σ_{j=a}^{c} P[W = j] for 0 ≤ a ≤ c ≤ r. It starts at
// the mode clamped to [a, c], the largest term of the range (log-concave
// pmf), and walks each way in a fixed order, stopping when the rest is
// provably negligible (see negligible). Terms are scaled by the first, so
// the sum s stays within [1, n+1] and never overflows.
func (b binom) logSum(a, c int) float64 {
	peak := min(max(b.mode(), a), c)
	t0 := b.logPMF(peak)
	s := 1.0
	for j := peak + 1; j <= c; j++ {
		e := math.Exp(b.logPMF(j) - t0)
		s += e
		if j < c && negligible(e, b.logUp(j), s) {
			break
		}
	}
	for j := peak - 1; j >= a; j-- {
		e := math.Exp(b.logPMF(j) - t0)
		s += e
		if j > a && negligible(e, b.logDown(j), s) {
			break
		}
	}
	return t0 + math.Log(s)
}

// Package privacyaudit is the statistics of the one-run privacy audit of
// Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training
// Run" (NeurIPS 2023, arXiv 2305.08846; section and theorem numbers below
// are those of arXiv v1). It is pure math: no files, no clocks; its one
// use of randomness, IdealReach's simulation, is seeded by its caller, so
// every function is deterministic and safe for concurrent use.
//
// # The audit
//
// Insert m canaries into a training run, each included independently with
// probability ½. After the run, score each canary from what the adversary
// sees (a released gradient's inner product with the canary's direction,
// the final model's loss), higher meaning "more likely included". Guess
// "included" for the k₊ highest scores and "excluded" for the k₋ lowest,
// abstaining on the rest (Guess); r = k₊ + k₋ guesses, v of them correct.
// For an (ε, δ)-DP run, v cannot be much larger than for ε-randomized
// response, whose guesses are each right with probability e^ε/(1+e^ε):
//
//   - Theorem 3.1: with q = e^ε/(1+e^ε) and f(w) = P[Binomial(r, q) ≥ w],
//     P[W ≥ v] ≤ f(v) + 2mδ·max_{1≤i≤v} (f(v−i) − f(v))/i, for all v.
//     PValue computes the right side (as the paper's Appendix D does,
//     capped at 1); for δ = 0 it is the binomial tail f(v).
//   - EpsilonLowerBound(m, r, v, δ, β) is the largest ε this test rejects
//     at level β (Appendix D's get_eps_audit, on a fixed grid): with
//     probability at least 1−β the run's true ε is at least it.
//   - Ceiling(m, r, δ, β) is the bound when all r guesses are right: the
//     most any audit with r guesses can show, however leaky the run.
//
// The bound reproduces the paper's printed values: 0.702 (m = r = 100,
// v = 75, δ = 0, β = 0.05), 0.699 (δ = 1e-4), 0.673 (m = 1000) in
// Appendix D, and 2.675 (m = 10⁵, r = 1510, v = 1439, δ = 1e-5) in §7.
//
// # What it shows and what it cannot
//
// The result is a lower bound: "ε ≥ ε̂ with confidence 1−β". A bound above
// the ledger's ε is evidence of a privacy bug (a missed clip, noise of the
// wrong scale, an unaccounted release), wrong with probability at most β.
// A bound close to the ledger's ε is evidence that the accounting is tight
// for this attack. A bound far below the ledger's ε is not evidence of
// anything: it may mean a weak attack, too few canaries (compare with the
// Ceiling: a ledger ε above it cannot be confirmed by r guesses), or
// canaries that are easy to hide. Never report it as the run's ε.
//
// # The f-DP analysis
//
// The same guesses also get the f-DP analysis of Mahloujifar, Melis and
// Chaudhuri, "Auditing f-Differential Privacy in One Run" (arXiv
// 2410.22235; fdp.go states and derives it): the hypothesis "the
// mechanism is μ-GDP" constrains the count of correct guesses through the
// whole Gaussian trade-off curve rather than its (ε, δ) corner, and
// GDPLowerBound returns the largest μ the count rejects at level β,
// GDPEpsilon that μ's ε at δ. On Gaussian-like mechanisms it is the
// tighter of the two (TestGDPLowerBoundIdealGame); Audit reports both.
//
// CurveRejects is the same test for any symmetric trade-off curve, and
// RunCurveBound applies it to the run's own family (curve.go,
// runcurve.go): T steps of the mechanism the ledger charges at noise
// multiplier σ', its curve built from the PLD accountant's (ε, δ) profile
// so that it lies below the exact one. Rejecting the run's own σ refutes
// what the ledger charges; the bound is the smallest σ' rejected, as the
// accountant's ε at δ.
//
// IdealReach tells these apart for white-box gradient canaries of a
// Poisson-subsampled Gaussian run: it simulates the same audit (the same
// score, SubsampledGaussianLLR, and splits) on a perfect mechanism with
// the run's m, q, T and σ and nothing else along the canaries'
// directions. A real bound near that reach is all the method can show; one
// well below it is lost to the system (e.g. the real gradients' component
// along the canaries).
//
// The guarantee needs k₊ and k₋ fixed before the scores are seen (trying
// several and keeping the best needs β divided by their number), the
// canaries' inclusion drawn independently with probability ½ from a
// source the run cannot see, and m counting every randomized canary,
// including those the auditor abstains on.
//
// # Validity and monotonicity
//
// If the run is (ε₀, δ)-DP it is (ε', δ)-DP for every ε' ≥ ε₀, so B(w) =
// inf_{ε'≥ε₀} PValue(w, ε') bounds P[W ≥ w]. Any ε̂ with PValue(v, ε̂) < β
// and ε̂ > ε₀ gives B(v) < β; with w* the least w with B(w) < β, that
// event lies in {W ≥ w*}, of probability at most B(w*) < β. So the result
// is valid whatever the shape of the p-value; the tests also check it
// exactly and by simulation against randomized response, the worst case.
//
// With c = 2mδ ≤ 1 the p-value is nondecreasing in ε and nonincreasing in
// v, which makes the search exact and the bound nondecreasing in v
// (derivation): the p-value is max_i g_i with g_i = (1 − c/i)·f(v) +
// (c/i)·f(v−i), coefficients ≥ 0 when c ≤ i, and f(w) grows with q
// (binomials are stochastically ordered in q), so each g_i and their max
// grow with ε. In v: with α(v) the max, splitting the window sum of the
// i-th candidate into P[W = v−1] and a window of the (i−1)-th candidate of
// v−1 gives α(v) ≤ α(v−1) + P[W = v−1], so p(v) ≤ p(v−1) − (1 − c)·P[W =
// v−1] ≤ p(v−1). For c > 1 both properties are tested, not proved (the
// tests reach c = 200), and validity does not depend on them.
//
// Other monotonicity, proved: the bound never rises with δ or m (the
// p-value grows with them), never falls as β grows (the rejection set
// grows), and for δ = 0 never rises with r at fixed v (Binomial(r+1, q)
// dominates Binomial(r, q)). It is 0 when v ≤ r/2 and β < ½: by symmetry
// P[Binomial(r, ½) ≥ v] ≥ ½, so not even ε = 0 is rejected.
//
// # Numerical error
//
// BinomialTail and PValue compute each term ln P[W = j] from math.Lgamma
// and sum relative to the largest term, in log space, with no normal
// approximation; the terms they drop are provably below 2⁻⁶⁰ of the sum
// (log-concavity of the pmf). The relative error is at most
// u·(8·lnΓ(r+1) + 6·r·L + |ln P| + n + 8), u = 2⁻⁵³ (BinomialTail's doc
// derives it): 7.9e-11 at r = 10⁴ and 1.3e-8 at r = MaxGuesses, for p = ½
// and P near 1. The tests
// compare with exact rational arithmetic (r ≤ 40) and 512-bit arithmetic
// (r ≤ 2000). EpsilonLowerBound returns a multiple of Tolerance (2⁻³⁰):
// the largest the bisection finds whose p-value is below β, so the
// supremum of the rejected ε lies within one Tolerance above it.
//
//	r, v, err := privacyaudit.Guess(scores, included, 100, 100)
//	lower, err := privacyaudit.EpsilonLowerBound(m, r, v, delta, 0.05)
//	ceiling, err := privacyaudit.Ceiling(m, r, delta, 0.05)
package privacyaudit

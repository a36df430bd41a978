package privacyaudit

import (
	"fmt"
	"math"
)

// SubsampledGaussianLLR is one step's log-likelihood ratio for a gradient
// canary seen through the Poisson-subsampled Gaussian mechanism: with the
// release's component along the canary's unit direction normalised to
// z = ⟨B·g̃, u⟩/(σC), z ~ N(0, 1) when the canary was not in the step's
// batch and N(1/σ, 1) when it was (its clipped gradient has norm C), and
// it was with probability q (if included at all). The ratio of the
// mixture (1−q)·N(0, 1) + q·N(1/σ, 1) to N(0, 1) at z is
//
//	1 − q + q·exp(z/σ − 1/(2σ²)),
//
// the per-step privacy loss of the subsampled Gaussian (Mironov, Talwar
// and Zhang, "Rényi Differential Privacy of the Sampled Gaussian
// Mechanism", 2019, §3; Steinke, Nasr and Jagielski 2023, §6, score
// white-box canaries by it). Summed over steps it is the Neyman–Pearson
// optimal score against one canary when the rest of g̃ is pure noise.
// It returns the logarithm, computed as ln((1−q)·1 + q·e^a) with
// logAddExp, so it neither overflows for large z nor loses the 1−q term
// (relative error a few ulps). q must be in (0, 1] and σ positive; it
// panics otherwise (a programmer error: the caller holds the run's q, σ).
func SubsampledGaussianLLR(z, q, sigma float64) float64 {
	if !(q > 0 && q <= 1) || !(sigma > 0) {
		panic(fmt.Sprintf("privacyaudit: SubsampledGaussianLLR: q = %v, σ = %v", q, sigma))
	}
	a := z/sigma - 1/(2*sigma*sigma)
	return logAddExp(math.Log1p(-q), math.Log(q)+a)
}

// Split is one choice of guesses: KPlus canaries guessed included, KMinus
// excluded (Guess).
type Split struct {
	KPlus, KMinus int
}

// Result is the outcome of one Split: r guesses, v of them right, the
// bound they give and the most r guesses could give (Ceiling), both at
// the β the audit assigned to the split, under the two analyses:
//
//   - Epsilon, Ceiling: the (ε, δ) analysis (EpsilonLowerBound, Ceiling);
//   - GDPMu, GDPCeilingMu: the f-DP analysis for μ-GDP (GDPLowerBound,
//     with v and with all r guesses right), and EpsilonFDP, CeilingFDP
//     the same μ as ε at the audit's δ (GDPEpsilon; both 0 when δ = 0,
//     where every μ > 0 has ε = ∞).
type Result struct {
	Split
	R, V             int
	Epsilon, Ceiling float64

	GDPMu, GDPCeilingMu    float64
	EpsilonFDP, CeilingFDP float64
}

// Audit runs the one-run audit for each of splits, chosen before the
// scores were seen, and returns the best (largest Epsilon; the first on
// a tie) and all of them. Each split is tested at level β/len(splits)
// (a union bound), so that the best is a valid bound at confidence 1−β:
// with probability at least 1−β every split's bound holds at once. Each
// split gets both analyses (Result); BestFDP picks the best split for the
// f-DP one, valid at 1−β on its own (the two analyses together hold at
// 1−2β). m is len(scores): every randomized canary counts, also those no
// split guesses on. Errors: those of Guess, EpsilonLowerBound, Ceiling,
// GDPLowerBound and GDPEpsilon (ErrInvalid), and ErrInvalid for no
// splits.
func Audit(scores []float64, included []bool, splits []Split, delta, beta float64) (best Result, all []Result, err error) {
	if len(splits) == 0 {
		return Result{}, nil, fmt.Errorf("%w: no splits", ErrInvalid)
	}
	b := beta / float64(len(splits))
	m := len(scores)
	for i, s := range splits {
		res := Result{Split: s}
		if res.R, res.V, err = Guess(scores, included, s.KPlus, s.KMinus); err != nil {
			return Result{}, nil, err
		}
		if res.Epsilon, err = EpsilonLowerBound(m, res.R, res.V, delta, b); err != nil {
			return Result{}, nil, err
		}
		if res.Ceiling, err = Ceiling(m, res.R, delta, b); err != nil {
			return Result{}, nil, err
		}
		if err = res.fdp(m, delta, b); err != nil {
			return Result{}, nil, err
		}
		all = append(all, res)
		if i == 0 || res.Epsilon > best.Epsilon {
			best = res
		}
	}
	return best, all, nil
}

// fdp fills in the f-DP fields of res at level b.
func (res *Result) fdp(m int, delta, b float64) (err error) {
	if res.GDPMu, err = GDPLowerBound(m, res.R, res.V, b); err != nil {
		return err
	}
	if res.GDPCeilingMu, err = GDPLowerBound(m, res.R, res.R, b); err != nil {
		return err
	}
	if delta == 0 {
		return nil
	}
	if res.EpsilonFDP, err = GDPEpsilon(res.GDPMu, delta); err != nil {
		return err
	}
	res.CeilingFDP, err = GDPEpsilon(res.GDPCeilingMu, delta)
	return err
}

// BestFDP returns the result with the largest f-DP bound (GDPMu; the first
// on a tie), the zero Result for none.
func BestFDP(all []Result) Result {
	var best Result
	for i, r := range all {
		if i == 0 || r.GDPMu > best.GDPMu {
			best = r
		}
	}
	return best
}

package privacyaudit

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/dpcluster/dpcluster/accounting"
)

// The f-DP test with the run's own family: the trade-off curve of the
// mechanism the ledger charges, T steps of the Poisson-subsampled
// (discrete) Gaussian at noise multiplier σ', from the PLD accountant
// (accounting/pld.go), instead of μ-GDP.
//
// # The curve
//
// The PLD accountant's ε(δ) is an upper bound on the exact ε at δ of the
// composed mechanism, up to a relative accounting.PLDNumericError below
// it, and it is the larger of the two directions (adding and removing a
// record), so the mechanism is (ε(δ)·(1 + 2·PLDNumericError), δ)-DP in
// both directions for every δ. For a finite set of δ (ProfileDeltas) those
// points give, through ProfileInverseTradeoff, a symmetric trade-off
// function f_σ' at most the mechanism's exact one: the exact curve is the
// supremum over all ε of the same lines (Dong, Roth and Su, the primal–dual
// view of f-DP), the accountant's δ(ε) is above the exact one, and a finite
// set drops lines. Every approximation lowers f_σ', so CurveRejects with
// it never rejects a σ' at which exact arithmetic on the exact curve
// accepts: rejecting f_σ' at the run's σ refutes, at confidence 1 − β,
// that the run releases what the ledger charges (one of the accountant's
// (ε(δ), δ) claims at the profile's δ is false). That is the exact rule
// of audit-privacy. What the finite profile costs: the test is weaker
// than the exact curve's (a rejection needs more right guesses);
// TestCurveRejectsAgreesWithGDP measures it on G_μ (within 3% of μ at ε
// steps of 0.02), docs/PRIVACY.md on the run's own curve.
//
// # The family bound
//
// RunCurveBound reports the smallest σ' on the grid σ·2^{k/RunCurveGridSteps},
// |k| ≤ 4·RunCurveGridSteps (σ/16 to 16σ), whose curve the guesses reject,
// and the accountant's ε at the run's δ for that σ': "the mechanism is
// less private than T steps at noise multiplier σ'", reported on the
// ledger's scale. Validity at confidence 1 − β does not need the test to
// be monotone in σ' (the argument of EpsilonLowerBound's doc): the
// mechanism at σ₀ is, for every σ' ≤ σ₀, the one at σ' with extra noise
// N(0, σ₀² − σ'²) per step (post-processing), so it satisfies f_σ' too
// (for the continuous Gaussian; for the discrete one, whose sum with more
// discrete noise is not a discrete Gaussian, this nesting is the
// accountant's approximately, not a theorem: there the family bound is
// as good as that, while the exact rule at σ itself needs no nesting);
// the least count of right guesses that rejects some σ' ≤ σ₀ has tail
// below β, so the reported σ' is above σ₀ with probability ≥ 1 − β. The
// search is a bisection on k, exact for a test monotone in σ' (the exact
// curves are: more noise is post-processing; the accountant's are up to
// its discretization, 5·10⁻⁴ relative in ε); its tolerance is the grid,
// 2^{1/64} ≈ 1.1% in σ'. ε is the accountant's (an upper bound on the
// exact ε of that σ' to within 5·10⁻⁴ relative), the scale on which the
// ledger's ε is computed, not a bound on the mechanism's ε in general: a
// mechanism outside the family may fail f_σ' and still be (ε, δ)-DP.

// RunCurveGridSteps is the number of grid steps per doubling of σ' in
// RunCurveBound's search.
const RunCurveGridSteps = 64

// runCurveGridMax is the largest |k| of the grid: σ' from σ/16 to 16σ
// (with the main job's q and T, the accountant's ε at δ = 10⁻⁵ is 0.011
// at σ' = 30).
const runCurveGridMax = 4 * RunCurveGridSteps

// ProfileDeltas are the δ at which RunFamily asks the accountant for ε:
// ½·4^{−j} down to 10⁻⁷ (12 points), covering where the audit's test
// reads the curve (its type I errors are between τv/m and k/m, about 10⁻⁶
// to ½ at 10⁴ canaries), each point one PLD composition. On the main
// job's configuration at m = 10⁴, 23 points (ratio 2) and 45 (ratio √2)
// moved no bound by a grid step (docs/PRIVACY.md).
var ProfileDeltas = profileDeltas()

func profileDeltas() []float64 {
	var ds []float64
	for d := 0.5; d > 1e-7; d /= 4 {
		ds = append(ds, d)
	}
	return ds
}

// RunFamily is the run's own family of mechanisms, indexed by the noise
// multiplier: Steps runs of Event(σ'), the event the ledger charges for a
// step at σ', accounted by the PLD accountant. Sigma is the run's σ, the
// grid's centre. Deltas are the profile's δ (nil: ProfileDeltas). It
// caches each grid point's curve; not safe for concurrent use.
type RunFamily struct {
	Steps  int64
	Event  func(sigma float64) accounting.Event
	Sigma  float64
	Deltas []float64

	curves map[int]func(float64) float64
}

// SubsampledGaussianFamily returns the family of T steps of the
// Poisson-subsampled Gaussian at rate q around σ.
func SubsampledGaussianFamily(q float64, steps int64, sigma float64) *RunFamily {
	return &RunFamily{Steps: steps, Sigma: sigma,
		Event: func(s float64) accounting.Event { return accounting.SubsampledGaussian(q, s) }}
}

// sigmaAt returns the grid's σ' for step k.
func (f *RunFamily) sigmaAt(k int) float64 {
	return f.Sigma * math.Exp2(float64(k)/RunCurveGridSteps)
}

// Epsilon returns the accountant's ε at δ of the family's member σ'.
func (f *RunFamily) Epsilon(sigma, delta float64) (float64, error) {
	return accounting.PLD{}.Epsilon(f.Event(sigma), f.Steps, delta)
}

// curve returns g(x) = f_σ'(1 − x) for σ' = σ·2^{k/RunCurveGridSteps},
// at most the exact one (see the file comment).
func (f *RunFamily) curve(k int) (func(float64) float64, error) {
	if g, ok := f.curves[k]; ok {
		return g, nil
	}
	deltas := f.Deltas
	if deltas == nil {
		deltas = ProfileDeltas
	}
	sigma := f.sigmaAt(k)
	// One PLD composition per δ, GOMAXPROCS at a time (the accountant is
	// safe for concurrent use).
	pts := make([]EpsDelta, len(deltas))
	errs := make([]error, len(deltas))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, d := range deltas {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			e, err := f.Epsilon(sigma, d)
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("privacyaudit: the run's curve at σ' = %v, δ = %v: %w", sigma, d, err)
			default:
				// The accountant's ε may be below the exact one by a
				// relative PLDNumericError: raise it by twice that, and
				// one ulp.
				pts[i] = EpsDelta{Epsilon: math.Nextafter(e*(1+2*accounting.PLDNumericError), math.Inf(1)), Delta: d}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	g := ProfileInverseTradeoff(pts)
	if f.curves == nil {
		f.curves = map[int]func(float64) float64{}
	}
	f.curves[k] = g
	return g, nil
}

// RunCurve is the outcome of the run-curve analysis of an audit.
type RunCurve struct {
	// Rejected says the guesses reject the run's own curve (σ' = σ) at
	// confidence 1 − β: the run does not release what the ledger charges.
	Rejected bool `json:"rejected"`
	// Sigma is the smallest grid σ' whose curve is rejected (0: none up
	// to 16σ), and Epsilon the accountant's ε at the run's δ for it (0:
	// none): the bound.
	Sigma   float64 `json:"sigma"`
	Epsilon float64 `json:"epsilon_lower_bound"`
}

// RunCurveBound tests the run's own family with the guesses of an audit:
// each result's R guesses, V right, among m canaries, at level
// β/len(results) (the union bound of Audit, so that all of them together
// hold at 1 − β). The test at σ' rejects when any result does. It returns
// the outcome at the run's σ and the family bound (see the file comment),
// and ErrInvalid for no results, the counts of EpsilonLowerBound, β
// outside (0, 1), δ outside (0, 1), and the accountant's errors.
func RunCurveBound(m int, results []Result, fam *RunFamily, delta, beta float64) (RunCurve, error) {
	switch {
	case len(results) == 0:
		return RunCurve{}, fmt.Errorf("%w: no results", ErrInvalid)
	case !(beta > 0 && beta < 1):
		return RunCurve{}, fmt.Errorf("%w: β = %v, want 0 < β < 1", ErrInvalid, beta)
	case !(delta > 0 && delta < 1):
		return RunCurve{}, fmt.Errorf("%w: δ = %v, want 0 < δ < 1", ErrInvalid, delta)
	case fam == nil || fam.Event == nil || !(fam.Sigma > 0) || math.IsInf(fam.Sigma, 0) || fam.Steps < 1:
		return RunCurve{}, fmt.Errorf("%w: no family, or σ, T out of range", ErrInvalid)
	}
	for _, r := range results {
		if err := checkCounts(m, r.R, r.V); err != nil {
			return RunCurve{}, err
		}
	}
	b := beta / float64(len(results))
	var err error
	rejects := func(k int) bool {
		g, e := fam.curve(k)
		if e != nil {
			err = e
			return false
		}
		for _, r := range results {
			if curveRejects(m, r.R, r.V, g, b) {
				return true
			}
		}
		return false
	}
	var out RunCurve
	// Bisection for the smallest rejected k, with !rejects(lo) and
	// rejects(hi), lo = −max−1 virtual; first k = 0 (the exact rule), then,
	// when it is accepted, the top of the grid (none rejected: done).
	lo, hi := -runCurveGridMax-1, 0
	if out.Rejected = rejects(0); !out.Rejected {
		if lo, hi = 0, runCurveGridMax; !rejects(hi) && err == nil {
			return out, nil
		}
	}
	for hi-lo > 1 && err == nil {
		mid := lo + (hi-lo)/2
		if rejects(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if err != nil {
		return RunCurve{}, err
	}
	out.Sigma = fam.sigmaAt(hi)
	if out.Epsilon, err = fam.Epsilon(out.Sigma, delta); err != nil {
		return RunCurve{}, err
	}
	return out, nil
}

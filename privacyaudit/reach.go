package privacyaudit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Ideal describes the ideal white-box audit of a Poisson-subsampled
// Gaussian run: m gradient canaries, each included with probability ½;
// an included canary is in each of T steps' batches with probability q;
// the auditor sees, per canary and step, the release's component along the
// canary's direction in noise-std units, z ~ N(1/σ, 1) when the canary was
// in the batch and N(0, 1) otherwise, and nothing else moves z (no other
// example's gradient has a component along the canary). It scores each
// canary by Σ_t SubsampledGaussianLLR(z_t, q, σ), the Neyman–Pearson
// optimal score for this model, and audits with the fixed Splits at δ, β
// as Audit does. This is the most the audit can show on a perfect
// mechanism with exactly these parameters: a real run's bound below it is
// lost to the system (other gradients along the canaries' directions), a
// real run's bound near it is all the method can show.
type Ideal struct {
	Canaries    int     // m ≥ 1
	SampleRate  float64 // q in (0, 1]
	Steps       int     // T ≥ 1
	Sigma       float64 // noise multiplier σ > 0
	Delta, Beta float64
	Splits      []Split
	// RunCurve adds the run-curve analysis (RunCurveBound with
	// SubsampledGaussianFamily(q, T, σ)) to each repetition: seconds per
	// repetition at T = 1000 (its curves are cached across repetitions).
	RunCurve bool
}

// Reach is the distribution, over Reps seeded repetitions of the ideal
// audit, of its bound: the median and the 10% and 90% quantiles (each
// the sorted bounds' element at index ⌊p·(Reps−1)⌋, no interpolation),
// and the largest ceiling among the splits (the same in every
// repetition); the same for the f-DP analysis's bound, ε at δ of the μ of
// BestFDP (FDP fields; 0 when δ = 0), and its largest value over the
// repetitions.
type Reach struct {
	Reps             int     `json:"reps"`
	Median           float64 `json:"median"`
	P10              float64 `json:"p10"`
	P90              float64 `json:"p90"`
	Ceiling          float64 `json:"ceiling"`
	CanariesIncluded float64 `json:"mean_included"`

	FDPMedian  float64 `json:"fdp_median"`
	FDPP10     float64 `json:"fdp_p10"`
	FDPP90     float64 `json:"fdp_p90"`
	FDPMax     float64 `json:"fdp_max"`
	FDPCeiling float64 `json:"fdp_ceiling"`

	// With Ideal.RunCurve: the run-curve bound (RunCurve.Epsilon) and the
	// number of repetitions that rejected the perfect mechanism's own
	// curve (at most about β·Reps, by the bound's validity).
	RunCurveMedian   float64 `json:"run_curve_median,omitempty"`
	RunCurveP10      float64 `json:"run_curve_p10,omitempty"`
	RunCurveP90      float64 `json:"run_curve_p90,omitempty"`
	RunCurveMax      float64 `json:"run_curve_max,omitempty"`
	RunCurveRejected int     `json:"run_curve_rejected,omitempty"`
}

// MaxIdealWork bounds m·T·reps, the number of simulated observations
// (about 0.1 µs each on the shared 2-core machine: 4·10⁸ is about 40 s).
const MaxIdealWork = 4e8

// IdealReach simulates reps repetitions of the ideal audit (see Ideal)
// with a PCG generator seeded by seed, and returns the distribution of
// their bounds, under both analyses of Audit. It is deterministic given
// its arguments. The bounds are those of Audit (its grid, Tolerance); the simulation's own error is
// statistical only: the quantiles of reps draws, which the caller sizes.
// It returns ErrInvalid for a parameter outside its range, reps < 1, or
// m·T·reps above 4·10⁸, and the errors of Audit.
func IdealReach(p Ideal, reps int, seed uint64) (Reach, error) {
	switch {
	case p.Canaries < 1 || p.Steps < 1 || reps < 1:
		return Reach{}, fmt.Errorf("%w: m = %d, T = %d, reps = %d, want all ≥ 1", ErrInvalid, p.Canaries, p.Steps, reps)
	case !(p.SampleRate > 0 && p.SampleRate <= 1) || !(p.Sigma > 0) || math.IsInf(p.Sigma, 0):
		return Reach{}, fmt.Errorf("%w: q = %v, σ = %v, want 0 < q ≤ 1, 0 < σ < ∞", ErrInvalid, p.SampleRate, p.Sigma)
	case float64(p.Canaries)*float64(p.Steps)*float64(reps) > MaxIdealWork:
		return Reach{}, fmt.Errorf("%w: m·T·reps = %d·%d·%d, want at most %g", ErrInvalid, p.Canaries, p.Steps, reps, float64(MaxIdealWork))
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed31))
	scores := make([]float64, p.Canaries)
	included := make([]bool, p.Canaries)
	bounds := make([]float64, reps)
	fdp := make([]float64, reps)
	run := make([]float64, reps)
	fam := SubsampledGaussianFamily(p.SampleRate, int64(p.Steps), p.Sigma)
	out := Reach{Reps: reps}
	nIn := 0
	for k := range reps {
		for i := range scores {
			included[i] = rng.IntN(2) == 1
			if included[i] {
				nIn++
			}
			scores[i] = idealScore(rng, included[i], p)
		}
		best, all, err := Audit(scores, included, p.Splits, p.Delta, p.Beta)
		if err != nil {
			return Reach{}, err
		}
		bounds[k] = best.Epsilon
		fdp[k] = BestFDP(all).EpsilonFDP
		if p.RunCurve {
			rc, err := RunCurveBound(p.Canaries, all, fam, p.Delta, p.Beta)
			if err != nil {
				return Reach{}, err
			}
			run[k] = rc.Epsilon
			if rc.Rejected {
				out.RunCurveRejected++
			}
		}
		if k == 0 {
			for _, r := range all {
				out.Ceiling = max(out.Ceiling, r.Ceiling)
				out.FDPCeiling = max(out.FDPCeiling, r.CeilingFDP)
			}
		}
	}
	slices.Sort(bounds)
	slices.Sort(fdp)
	slices.Sort(run)
	at := func(b []float64, f float64) float64 { return b[int(f*float64(reps-1))] }
	out.Median, out.P10, out.P90 = at(bounds, 0.5), at(bounds, 0.1), at(bounds, 0.9)
	out.FDPMedian, out.FDPP10, out.FDPP90, out.FDPMax = at(fdp, 0.5), at(fdp, 0.1), at(fdp, 0.9), fdp[reps-1]
	if p.RunCurve {
		out.RunCurveMedian, out.RunCurveP10, out.RunCurveP90, out.RunCurveMax = at(run, 0.5), at(run, 0.1), at(run, 0.9), run[reps-1]
	}
	out.CanariesIncluded = float64(nIn) / float64(reps)
	return out, nil
}

// idealScore draws one canary's T observations and returns its summed
// log-likelihood ratio.
func idealScore(rng *rand.Rand, in bool, p Ideal) float64 {
	var s float64
	shift := 1 / p.Sigma
	for range p.Steps {
		z := rng.NormFloat64()
		if in && rng.Float64() < p.SampleRate {
			z += shift
		}
		s += SubsampledGaussianLLR(z, p.SampleRate, p.Sigma)
	}
	return s
}

package accounting

import (
	"fmt"
	"math"
)

// Calibration bounds: the search for σ covers [minSigma, maxSigma].
const (
	minSigma = 1e-3
	maxSigma = 1e4
)

// checkCalibration validates the inputs every Calibrate shares.
func checkCalibration(target float64, steps int64, delta float64) error {
	if err := checkParams(1, steps, delta); err != nil {
		return err
	}
	if !(target > 0) || math.IsInf(target, 0) {
		return fmt.Errorf("%w: target epsilon %v must be positive and finite", ErrInvalidParameter, target)
	}
	return nil
}

// sigmaSearch is the σ calibration both accountants run: bracket the
// answer, then let the accountant's own refinement shrink the bracket.
// It relies on eps being non-increasing in σ.
type sigmaSearch struct {
	// eps is the run's ε at σ (+Inf where the accountant fails).
	eps    func(sigma float64) float64
	target float64
	// steps, delta and event only name the run in the ErrUnreachable
	// message.
	steps int64
	delta float64
	event func(sigma float64) Event
	// start is the first upper end tried; shrink the factor by which the
	// lower end walks down.
	start, shrink float64
}

// newSigmaSearch returns the search for acc's σ: eps is acc's ε of steps
// runs of event(σ) at δ, +Inf where acc fails.
func newSigmaSearch(acc Accountant, target float64, steps int64, delta float64, event func(sigma float64) Event, start, shrink float64) sigmaSearch {
	return sigmaSearch{target: target, steps: steps, delta: delta, event: event, start: start, shrink: shrink,
		eps: func(sigma float64) float64 {
			e, err := acc.Epsilon(event(sigma), steps, delta)
			if err != nil {
				return math.Inf(1)
			}
			return e
		}}
}

// run brackets the answer and refines it: refine gets lo < hi with
// eps(lo) > target ≥ eps(hi) and returns the σ to report.
//
// The bracket: hi starts at s.start and doubles (up to maxSigma, where
// the target is ErrUnreachable) until eps(hi) ≤ target; then lo = hi/shrink
// walks down, moving hi along, while eps(lo) ≤ target. If lo reaches
// minSigma, hi is returned unrefined.
func (s sigmaSearch) run(refine func(lo, hi float64) float64) (float64, error) {
	hi := s.start
	for s.eps(hi) > s.target {
		if hi >= maxSigma {
			return 0, fmt.Errorf("%w: ε=%v at δ=%v needs σ > %v for %d steps of %s", ErrUnreachable, s.target, s.delta, maxSigma, s.steps, s.event(hi).Describe())
		}
		hi = math.Min(hi*2, maxSigma)
	}
	lo := hi / s.shrink
	for lo > minSigma && s.eps(lo) <= s.target {
		hi, lo = lo, lo/s.shrink
	}
	if lo <= minSigma {
		return hi, nil
	}
	return refine(lo, hi), nil
}

// bisect shrinks the bracket by bisection to relative width 1e-9 and
// returns its upper end. Invariant: eps(lo) > target ≥ eps(hi).
func (s sigmaSearch) bisect(lo, hi float64) float64 {
	for hi-lo > 1e-9*hi {
		mid := lo + (hi-lo)/2
		if s.eps(mid) <= s.target {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// regulaFalsi shrinks the bracket to relative width 1e-6 and returns its
// upper end, for accountants whose every evaluation is costly (one PLD
// evaluation is an FFT): regula falsi on log ε (smooth in σ) with the
// Illinois modification (Dowell and Jarratt 1971), falling back to
// bisection when an interpolated point lands at an end. Invariant:
// eps(lo) > target ≥ eps(hi).
func (s sigmaSearch) regulaFalsi(lo, hi float64) float64 {
	f := func(sigma float64) float64 { return math.Log(s.eps(sigma) / s.target) }
	fLo, fHi := f(lo), f(hi)
	side := 0
	for hi-lo > 1e-6*hi {
		mid := lo + (hi-lo)/2
		if fLo > fHi && !math.IsInf(fLo, 0) && !math.IsInf(fHi, 0) {
			x := hi - fHi*(hi-lo)/(fHi-fLo)
			if x > lo && x < hi {
				mid = x
			}
		}
		fm := f(mid)
		if fm <= 0 {
			hi, fHi = mid, fm
			if side == 1 {
				fLo /= 2
			}
			side = 1
		} else {
			lo, fLo = mid, fm
			if side == -1 {
				fHi /= 2
			}
			side = -1
		}
		// Step just across a converging end so the bracket itself shrinks.
		if hi-lo > 1e-6*hi && side == 1 {
			if x := hi * (1 - 5e-7); x > lo {
				if fx := f(x); fx > 0 {
					lo, fLo = x, fx
				}
			}
		}
	}
	return hi
}

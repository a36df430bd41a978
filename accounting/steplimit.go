package accounting

import "math"

// StepLimit returns T*, the largest count of runs of step whose PLD ε at δ
// is at most target (0 if one run exceeds it), at most MaxStepLimit.
//
// Each PLD evaluation costs an FFT, so the search is a bracketing secant
// on log ε against log T (smooth, close to ε ∝ √T): it starts at planned
// if it is positive (a run's planned step count, for which σ was
// calibrated, so T* is planned or just above it and the search closes its
// bracket in two evaluations), else at the RDP accountant's step count for
// the same budget (PLD allows at least about as many), extrapolates with
// ε ∝ √T until the limit is bracketed, then interpolates; every guess x is
// followed by its neighbour on the far side (x+1 after an x within the
// target, x−1 after one above it), which closes the bracket when the guess
// is right, as it usually is within one or two rounds. After four rounds
// it bisects, so it always terminates. It assumes PLD ε is non-decreasing
// in T, which composition guarantees. The result does not depend on where
// the search starts.
func (p PLD) StepLimit(step Event, target, delta float64, planned int64) (int64, error) {
	s, err := PLDStep(step)
	if err != nil {
		return 0, err
	}
	l := limitSearch{target: target, at: func(n int64) (float64, error) {
		e := s
		e.Count = n
		return p.EpsilonSteps([]PLDEvent{e}, delta)
	}}
	start := int64(1)
	if planned > 0 {
		start = min(planned, MaxStepLimit)
	} else {
		c := subsampledCurve(s.discrete(), s.SampleRate, s.NoiseMultiplier, DefaultOrders())
		if e1, _, err := RDPToEpsilon(DefaultOrders(), c, delta); err == nil && e1 < target {
			start = rdpStepLimit(DefaultOrders(), c, delta, target)
		}
	}
	return l.run(start, planned > 0)
}

// limitSearch is the state of PLD.StepLimit's search: lo is within the
// target (or 0), hi above it (or 0: not found yet).
type limitSearch struct {
	target       float64
	at           func(n int64) (float64, error)
	lo, hi       int64
	epsLo, epsHi float64
}

// try evaluates n and moves the end of the bracket it belongs to.
func (l *limitSearch) try(n int64) (bool, error) {
	eps, err := l.at(n)
	if err != nil {
		return false, err
	}
	if eps <= l.target {
		l.lo, l.epsLo = n, eps
		return true, nil
	}
	l.hi, l.epsHi = n, eps
	return false, nil
}

// run searches from start; a good guess (planned) is followed at once by
// its neighbour, which may close the bracket.
func (l *limitSearch) run(start int64, good bool) (int64, error) {
	ok, err := l.try(start)
	if err != nil {
		return 0, err
	}
	if good {
		if ok && start < MaxStepLimit {
			_, err = l.try(start + 1)
		} else if !ok && start > 1 {
			_, err = l.try(start - 1)
		}
		if err != nil {
			return 0, err
		}
	}
	for round := 0; l.hi == 0 || l.hi-l.lo > 1; round++ {
		if l.hi == 0 && l.lo >= MaxStepLimit {
			return MaxStepLimit, nil
		}
		x := l.next(round)
		ok, err := l.try(x)
		if err != nil {
			return 0, err
		}
		// The neighbour on the far side closes the bracket if x was right.
		if ok && (l.hi == 0 || l.hi > x+1) && x < MaxStepLimit {
			_, err = l.try(x + 1)
		} else if !ok && x-1 > l.lo {
			_, err = l.try(x - 1)
		}
		if err != nil {
			return 0, err
		}
	}
	return l.lo, nil
}

// next returns the count to try in the given round.
func (l *limitSearch) next(round int) int64 {
	lo, hi := l.lo, l.hi
	switch {
	case hi == 0: // extrapolate up with ε ∝ √T, a little beyond
		r := l.target / l.epsLo
		x := int64(math.Min(math.Ceil(float64(lo)*r*r*1.01)+1, float64(MaxStepLimit)))
		return max(x, lo+1)
	case round >= 4 || lo == 0 || !(l.epsLo > 0):
		return lo + (hi-lo)/2
	}
	// Secant on (log T, log ε).
	slope := math.Log(l.epsHi/l.epsLo) / math.Log(float64(hi)/float64(lo))
	f := float64(lo) * math.Exp(math.Log(l.target/l.epsLo)/slope)
	if math.IsNaN(f) {
		f = float64(lo + (hi-lo)/2)
	}
	return int64(math.Min(math.Max(math.Floor(f), float64(lo+1)), float64(hi-1)))
}

// rdpStepLimit returns the largest T with RDP ε(T·rdp) ≤ target at δ
// (at least 1), at most MaxStepLimit, by doubling and bisection on the
// cheap RDP conversion; rdp is one step's RDP over orders.
func rdpStepLimit(orders, rdp []float64, delta, target float64) int64 {
	scaled := make([]float64, len(rdp))
	ok := func(t int64) bool {
		for i := range rdp {
			scaled[i] = float64(t) * rdp[i]
		}
		eps, _, err := RDPToEpsilon(orders, scaled, delta)
		return err == nil && eps <= target && !math.IsNaN(eps)
	}
	lo, hi := int64(1), int64(2)
	for ok(hi) {
		if hi >= MaxStepLimit {
			return MaxStepLimit
		}
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

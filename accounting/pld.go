package accounting

import (
	"fmt"
	"math"
)

// This file is the privacy-loss-distribution (PLD) accountant for the
// Poisson-subsampled Gaussian mechanism (L2 sensitivity 1, noise multiplier
// σ, sampling rate q) under add/remove-one adjacency.
//
// # The mechanism's two privacy loss distributions
//
// Let μ0 = N(0, σ²), μ1 = N(1, σ²) and M = (1−q)μ0 + qμ1 (the output with
// the record's contribution present with probability q). Adding or removing
// one record gives the two ordered pairs ("remove" and "add" in Google
// dp_accounting's naming):
//
//	remove: P = M,  Q = μ0,  L(x) = log(1−q + q·e^{(2x−1)/(2σ²)}),  x ~ P
//	add:    P = μ0, Q = M,   L(x) = −log(1−q + q·e^{(2x−1)/(2σ²)}), x ~ P
//
// (Zhu, Dong, Wang, "Optimal Accounting of Differential Privacy via
// Characteristic Function", AISTATS 2022, Sec. 5, show these pairs are
// tight for the subsampled Gaussian.) The privacy loss distribution (PLD)
// of (P, Q) is the law of L under P, and the pair is (ε, δ)-DP for
//
//	δ(ε) = E_P[(1 − e^{ε−L})⁺]                                         (1)
//
// (the hockey-stick divergence H_{e^ε}(P‖Q); an atom of P at L = +∞
// counts fully). Composition of T mechanisms convolves their PLDs. Both
// directions are composed separately (one record is either added or removed
// for the whole run) and the larger ε is reported.
//
// # Pessimistic discretization ("connect the dots")
//
// We follow Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the Dots:
// Tighter Discrete Approximations of Privacy Loss Distributions" (PETS
// 2022). On a grid ℓ_j = j·h, their pessimistic PLD is the one whose
// privacy profile δ(ε), as a function of e^ε, is the piecewise-linear
// interpolation of the exact profile through the points (e^{ℓ_j}, δ(ℓ_j))
// (the "dots"); δ is convex in e^ε, so the chord lies above it. The atoms of
// that PLD have a direct form, which we use: the P-mass p_j and Q-mass
// r_j = E_P[e^{−L}; L ∈ (ℓ_j, ℓ_{j+1}]] of each grid interval are split
// onto its two endpoints so that both are preserved,
//
//	a = (e^{ℓ_{j+1}}·r_j − p_j)/(e^h − 1) at ℓ_j,   b = p_j − a at ℓ_{j+1},   (2)
//
// which is what differencing the interpolated profile gives (its slope in
// e^ε on (e^{ℓ_j}, e^{ℓ_{j+1}}) is −Q(L > ε)-like and changes only at grid
// points). The mass below the lowest grid point ℓ_lo is moved up onto it,
// and the mass above the highest ℓ_hi is split by (2) between ℓ_hi and +∞:
// the atom at +∞ is exactly δ(ℓ_hi) (never dropped).
//
// Why this never under-counts, including after composition: write y = e^{−L}.
// In (1), δ(ε) = E_P[g(y)] with g(y) = (1 − e^ε y)⁺, convex and
// non-increasing in y. Within an interval, (2) replaces the law of y by the
// two-point law on the interval's ends with the same mass and mean, which is
// larger in convex order (Jensen), and moving the bottom tail onto ℓ_lo
// lowers y pointwise; both raise E_P[g(y)]. For a composition,
// δ_T(ε) = E[g_ε(y_1···y_T)] is convex and non-increasing in each y_i with
// the others fixed, so replacing the steps one at a time (they are
// independent under P^T) raises it again. Hence δ of the composed
// discretized PLD is ≥ the exact δ for every ε, and the ε we solve for is an
// upper bound. The tightening over rounding every loss up to the next grid
// point (privacy buckets, Meiser and Mohammadi, CCS 2018) is that the mean
// of L moves by O(h²) per step instead of O(h).
//
// # Composition by FFT, with exponential tilting
//
// The T-fold convolution is one real FFT of size N, a pointwise power
// (product over events of different (q, σ)), and one inverse FFT: the
// cyclic convolution on a window of N grid points. Absolute FFT round-off
// is about 1e-16 of the largest entry, far above the masses that matter at
// δ = 1e-18. So before transforming we tilt the step PLD, p_k ↦
// p_k·e^{λℓ_k}/Z (Z its total), which commutes with convolution, and
// untilt the result, p_k = r_k·Z^T·e^{−λℓ_k}; with λ the Chernoff-optimal
// exponent at the target δ (the minimizer in (3) below), the tilted
// composition peaks near the answer, where its round-off is small relative
// to the masses there.
//
// The window [b, b + N·h) is chosen from Chernoff bounds: masses outside it
// wrap around (aliasing), which only adds mass somewhere and so can only
// raise δ, except for mass above the window, which may be counted at too
// low a loss; its total is bounded with the discretized PLD's own moment
// generating function,
//
//	P(ΣL > t) ≤ min_{s>0} exp(Σ_events count·K(s) − s·t),  K(s) = log Σ_k p_k e^{sℓ_k}   (3)
//
// and added to the atom at +∞. Mass below the window does not enter δ(ε)
// for ε ≥ b, and ε is never solved below b (if δ(b) ≤ δ already, b is
// returned, itself an upper bound).
//
// # Numeric error
//
// Every approximation above is on the pessimistic side, so the reported ε
// is an upper bound up to floating-point error: relative ~1e-12 in the
// interval masses (differences of erfc values), relative ~1e-12·(1/h) in
// the split (2) (it subtracts two nearly equal numbers), and FFT round-off
// of about N·2⁻⁵² times the largest tilted entry, which with the tilt is
// relative ~1e-10 near the answer. Negative round-off is clamped to 0. In
// all, the reported ε may fall below the exact ε by at most a relative
// PLDNumericError (a deliberately loose bound on the above; the tests check
// the q = 1 case, where δ(ε) is known exactly, and never find it below).
// Above the exact ε, the discretization costs O(T·h²) in ε; h is chosen so
// that the window of N ≥ 2^14 points spans the composed loss from well below
// its mean to the Chernoff level at δ·1e-12, with N doubled (up to 2^23)
// until T·h²/8 is below 5e-5 of the window's upper reach. The excess is
// then below 5e-4 relative: the excess shrinks like h² (the drift above),
// and TestPLDDiscretizationError measures it, ε(h) − ε(h/4) scaled by
// 16/15 (Richardson), for runs of 1 to 10⁴ steps. (Until
// the ledger recorded ε for every count, N started at 2^18, with excess
// below 1e-5 at 16 times the cost per evaluation; the ledger's count grid
// rounds ε up by up to 0.8% anyway: PLDGridRatio.)
// PLDNumericError is the stated relative numerical error of the PLD
// accountant: the ε it reports is at least (1 − PLDNumericError) times the
// exact ε of the Poisson-subsampled Gaussian mechanism (see the file
// comment of accounting/pld.go for its sources).
const PLDNumericError = 1e-6

// PLDEvent is Count runs of the Poisson-subsampled Gaussian mechanism with
// sampling rate SampleRate and noise multiplier NoiseMultiplier, the unit
// the PLD accountant composes. Events with different parameters compose
// (a run whose steps differ, or several runs).
//
// With a positive Dimension it is the discrete Gaussian mechanism instead
// (accounting/pld_discrete.go): Dimension coordinates of N_ℤ(0, s²) noise,
// s = LatticeScale in lattice units, at the same effective noise
// multiplier; both are zero for the continuous Gaussian.
type PLDEvent struct {
	SampleRate      float64
	NoiseMultiplier float64
	Count           int64
	Dimension       int64
	LatticeScale    float64
}

// Event returns the event of one of e's steps, which PLDStep maps back to
// e with Count 1: PoissonSampled(q, Gaussian(σ)), or with a Dimension
// PoissonSampled(q, DiscreteGaussianLattice(σ, LatticeScale, Dimension)).
func (e PLDEvent) Event() Event {
	if e.discrete() {
		return PoissonSampled(e.SampleRate, DiscreteGaussianLattice(e.NoiseMultiplier, e.LatticeScale, e.Dimension))
	}
	return SubsampledGaussian(e.SampleRate, e.NoiseMultiplier)
}

// discrete reports whether e is a discrete Gaussian event.
func (e PLDEvent) discrete() bool { return e.Dimension > 0 }

// PLD is the privacy-loss-distribution accountant (the comment at the
// top of accounting/pld.go, and accounting/pld_discrete.go for the discrete
// Gaussian). It charges the (Poisson-sampled) Gaussian and the discrete
// Gaussian that names its lattice (DiscreteGaussianLattice); any other
// event is ErrInvalidEvent. Every ε it reports is an upper bound on the
// exact ε up to a relative PLDNumericError. The zero value is ready to
// use; it is safe for concurrent use (its caches lock themselves).
type PLD struct{}

// Name returns NamePLD.
func (PLD) Name() Name { return NamePLD }

// Epsilon returns the PLD ε, at δ, of count ≥ 1 runs of the event charged
// for one step: a (Poisson-sampled) Gaussian, or discrete Gaussian with
// its lattice (DiscreteGaussianLattice); another event is
// ErrInvalidEvent.
func (p PLD) Epsilon(e Event, count int64, delta float64) (float64, error) {
	s, err := PLDStep(e)
	if err != nil {
		return 0, err
	}
	s.Count = count
	return p.EpsilonSteps([]PLDEvent{s}, delta)
}

// EpsilonSteps returns the ε, at δ, of the composition of events by the
// PLD accountant. Events with Count 0 are ignored; at least one event must
// have a positive count. It returns ErrInvalidParameter for a q outside
// (0, 1], σ not positive and finite, a negative count, an inconsistent
// lattice or δ outside (0, 1).
func (PLD) EpsilonSteps(events []PLDEvent, delta float64) (float64, error) {
	if !(delta > 0 && delta < 1) {
		return 0, fmt.Errorf("%w: delta %v must be in (0, 1)", ErrInvalidParameter, delta)
	}
	live, err := liveSteps(events)
	if err != nil {
		return 0, err
	}
	key := pldMemoKey(live, delta)
	if eps, ok := pldMemoGet(key); ok {
		return eps, nil
	}
	eps, err := pldEpsilonLive(live, delta)
	if err == nil {
		pldMemoPut(key, eps)
	}
	return eps, err
}

// liveSteps validates events and returns those with a positive count.
func liveSteps(events []PLDEvent) ([]PLDEvent, error) {
	var live []PLDEvent
	for _, e := range events {
		switch {
		case !(e.SampleRate > 0 && e.SampleRate <= 1):
			return nil, fmt.Errorf("%w: sample rate %v must be in (0, 1]", ErrInvalidParameter, e.SampleRate)
		case !(e.NoiseMultiplier > 0) || math.IsInf(e.NoiseMultiplier, 0):
			return nil, fmt.Errorf("%w: noise multiplier %v must be positive and finite", ErrInvalidParameter, e.NoiseMultiplier)
		case e.Count < 0:
			return nil, fmt.Errorf("%w: negative count %d", ErrInvalidParameter, e.Count)
		case e.Dimension < 0 || (e.Dimension == 0) != (e.LatticeScale == 0) ||
			(e.Dimension > 0 && !(e.LatticeScale >= 1 && e.LatticeScale >= e.NoiseMultiplier && !math.IsInf(e.LatticeScale, 0))):
			return nil, fmt.Errorf("%w: discrete Gaussian dimension %d and lattice scale %v must both be zero (continuous) or a positive dimension and a finite scale ≥ max(1, σ)",
				ErrInvalidParameter, e.Dimension, e.LatticeScale)
		case e.Count > 0:
			live = append(live, e)
		}
	}
	if len(live) == 0 {
		return nil, fmt.Errorf("%w: no steps to account", ErrInvalidParameter)
	}
	return live, nil
}

// PLDStep returns the PLD event of one run of e (Count 1): a
// Poisson-sampled Gaussian or discrete Gaussian (or a plain one, q = 1); a
// discrete Gaussian must name its lattice. Other mechanisms are
// ErrInvalidEvent.
func PLDStep(e Event) (PLDEvent, error) {
	if err := e.Validate(); err != nil {
		return PLDEvent{}, err
	}
	q, inner := 1.0, e
	if e.Kind == KindPoissonSampled {
		q, inner = e.SampleRate, *e.Event
	}
	switch {
	case inner.Kind == KindGaussian:
		return PLDEvent{SampleRate: q, NoiseMultiplier: inner.NoiseMultiplier, Count: 1}, nil
	case inner.Kind == KindDiscreteGaussian && inner.Dimension > 0:
		return PLDEvent{SampleRate: q, NoiseMultiplier: inner.NoiseMultiplier, Count: 1,
			Dimension: inner.Dimension, LatticeScale: inner.LatticeScale}, nil
	case inner.Kind == KindDiscreteGaussian:
		return PLDEvent{}, fmt.Errorf("%w: the PLD accountant charges a discrete Gaussian only with its lattice (dimension and scale), and %s names none (an event of a run configured for the RDP accountant)", ErrInvalidEvent, e.Describe())
	}
	return PLDEvent{}, fmt.Errorf("%w: the PLD accountant charges only the (Poisson-sampled) Gaussian and discrete Gaussian mechanisms, not %s", ErrInvalidEvent, e.Describe())
}

// pldEpsilonLive is EpsilonSteps on validated events, all with a
// positive count.
func pldEpsilonLive(live []PLDEvent, delta float64) (float64, error) {
	return pldEpsilonFine(live, delta, 0)
}

// pldEpsilonFine is pldEpsilonLive on a window 2^fine times as fine (the
// same span, 2^fine times as many points): TestPLDDiscretizationError
// measures the discretization's excess against it.
func pldEpsilonFine(live []PLDEvent, delta float64, fine int) (float64, error) {
	prep := pldPrepare(live, delta, fine)
	tv := latticeTV(live)
	eps := 0.0
	for _, dir := range []pldDirection{pldRemove, pldAdd} {
		c := prep.compose(live, dir)
		e, ok := pldEpsilonSlack(c.solve, delta, tv)
		if !ok || math.IsNaN(e) {
			// The window cannot bracket the answer (or, for discrete
			// events, the lattice slack leaves no δ): the RDP bound, also
			// an upper bound, and never an error.
			e = prep.rdpEpsilon(live, delta)
		}
		eps = math.Max(eps, e)
	}
	if tv > 0 {
		// For the discrete Gaussian the lattice slack can make the PLD
		// bound the looser of the two; both are upper bounds, so take the
		// smaller: never above the discrete RDP bound.
		if r := prep.rdpEpsilon(live, delta); r < eps {
			eps = r
		}
	}
	return eps, nil
}

// Calibrate returns the smallest σ (to relative precision 1e-6) such that
// steps runs of event(σ) reach a PLD ε ≤ target at δ (Accountant.Calibrate
// states the contract). event(σ) must be an event PLD charges (Epsilon);
// one it cannot is ErrInvalidEvent. The search starts at the RDP
// accountant's σ (RDP's ε is larger, so its σ is an upper end) and
// shrinks the bracket by regula falsi: each PLD evaluation costs an FFT.
func (p PLD) Calibrate(target float64, steps int64, delta float64, event func(sigma float64) Event) (float64, error) {
	if err := checkCalibration(target, steps, delta); err != nil {
		return 0, err
	}
	if _, err := PLDStep(event(1)); err != nil {
		return 0, err
	}
	// Bracket: RDP's σ is a good upper start (RDP's ε is larger), and the
	// PLD σ is rarely below a third of it.
	start := 1.0
	if s, err := (RDP{}).Calibrate(target, steps, delta, event); err == nil {
		start = s
	}
	s := newSigmaSearch(p, target, steps, delta, event, start, 1.5)
	return s.run(s.regulaFalsi)
}

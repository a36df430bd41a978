package ledger

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/cmplx"
	"slices"
	"sync"

	"gonum.org/v1/gonum/dsp/fourier"
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
// comment of ledger/pld.go for its sources).
const PLDNumericError = 1e-6

// PLDEvent is Count runs of the Poisson-subsampled Gaussian mechanism with
// sampling rate SampleRate and noise multiplier NoiseMultiplier, the unit
// the PLD accountant composes. Events with different parameters compose
// (a run whose steps differ, or several runs).
//
// With a positive Dimension it is the discrete Gaussian mechanism instead
// (ledger/pld_discrete.go): Dimension coordinates of N_ℤ(0, s²) noise,
// s = LatticeScale in lattice units, at the same effective noise
// multiplier; both are zero for the continuous Gaussian.
type PLDEvent struct {
	SampleRate      float64
	NoiseMultiplier float64
	Count           int64
	Dimension       int64
	LatticeScale    float64
}

// discrete reports whether e is a discrete Gaussian event.
func (e PLDEvent) discrete() bool { return e.Dimension > 0 }

// pldWindowBits sets the smallest FFT size N = 2^pldWindowBits of the
// composition window.
const pldWindowBits = 14

// pldMaxWindowBits caps the FFT size for very long compositions.
const pldMaxWindowBits = 23

// pldMaxStep caps the number of grid points of one step's discretized PLD;
// a longer step is folded modulo N (exact for a cyclic convolution).
const pldMaxStep = 1 << 23

// gaussTail is the number of standard deviations of x beyond which a step's
// density is treated as tail (moved pessimistically, never dropped: below
// the grid onto its lowest point, above it to +∞). Φ(−20) ≈ 3e-89, so even
// 10⁶ steps move less than 1e-82 to +∞.
const gaussTail = 20

// PLDEpsilon returns the ε, at δ, of steps runs of the Poisson-subsampled
// Gaussian mechanism with rate q and noise multiplier sigma, by the PLD
// accountant (see the comment at the top of ledger/pld.go). The result is
// an upper bound on the exact ε up to a relative PLDNumericError. It
// returns ErrInvalidParameter for q outside (0, 1], σ not positive and
// finite, steps < 1 or δ outside (0, 1).
func PLDEpsilon(q, sigma float64, steps int64, delta float64) (float64, error) {
	return PLDEpsilonEvents([]PLDEvent{{SampleRate: q, NoiseMultiplier: sigma, Count: steps}}, delta)
}

// PLDEpsilonEvents returns the ε, at δ, of the composition of events by the
// PLD accountant. Events with Count 0 are ignored; at least one event must
// have a positive count.
func PLDEpsilonEvents(events []PLDEvent, delta float64) (float64, error) {
	if !(delta > 0 && delta < 1) {
		return 0, fmt.Errorf("%w: delta %v must be in (0, 1)", ErrInvalidParameter, delta)
	}
	var live []PLDEvent
	for _, e := range events {
		switch {
		case !(e.SampleRate > 0 && e.SampleRate <= 1):
			return 0, fmt.Errorf("%w: sample rate %v must be in (0, 1]", ErrInvalidParameter, e.SampleRate)
		case !(e.NoiseMultiplier > 0) || math.IsInf(e.NoiseMultiplier, 0):
			return 0, fmt.Errorf("%w: noise multiplier %v must be positive and finite", ErrInvalidParameter, e.NoiseMultiplier)
		case e.Count < 0:
			return 0, fmt.Errorf("%w: negative count %d", ErrInvalidParameter, e.Count)
		case e.Dimension < 0 || (e.Dimension == 0) != (e.LatticeScale == 0) ||
			(e.Dimension > 0 && !(e.LatticeScale >= 1 && e.LatticeScale >= e.NoiseMultiplier && !math.IsInf(e.LatticeScale, 0))):
			return 0, fmt.Errorf("%w: discrete Gaussian dimension %d and lattice scale %v must both be zero (continuous) or a positive dimension and a finite scale ≥ max(1, σ)",
				ErrInvalidParameter, e.Dimension, e.LatticeScale)
		case e.Count > 0:
			live = append(live, e)
		}
	}
	if len(live) == 0 {
		return 0, fmt.Errorf("%w: no steps to account", ErrInvalidParameter)
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

// pldEpsilonLive is PLDEpsilonEvents on validated events, all with a
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

// pldMemo remembers PLDEpsilonEvents's results, keyed by its exact
// inputs (the bits of δ and of every live event's fields, in order). The
// function is deterministic and costly (two FFT compositions: about 0.25 s
// for 10⁴ steps, tens of seconds under the race detector), and one process
// asks for the same values again and again: each bisection step of a σ
// calibration that the coordinator and every node of the same run repeat,
// and the state machine's budget checks. A hit returns the very value the
// computation returned. Bounded: cleared when it holds pldMemoMax results.
var pldMemo struct {
	sync.Mutex
	m map[string]float64
}

const pldMemoMax = 1024

func pldMemoKey(live []PLDEvent, delta float64) string {
	b := make([]byte, 0, 8+40*len(live))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(delta))
	for _, e := range live {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.SampleRate))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.NoiseMultiplier))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Count))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Dimension))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.LatticeScale))
	}
	return string(b)
}

func pldMemoGet(key string) (float64, bool) {
	pldMemo.Lock()
	defer pldMemo.Unlock()
	eps, ok := pldMemo.m[key]
	return eps, ok
}

func pldMemoPut(key string, eps float64) {
	pldMemo.Lock()
	defer pldMemo.Unlock()
	if pldMemo.m == nil || len(pldMemo.m) >= pldMemoMax {
		pldMemo.m = make(map[string]float64)
	}
	pldMemo.m[key] = eps
}

// PLDEventEpsilon returns the PLD ε, at δ, of count runs of the event the
// ledger charges for one step: a (Poisson-sampled) Gaussian, or discrete
// Gaussian with its lattice (DiscreteGaussianLattice). It is the PLD
// counterpart of EventEpsilon; another event is ErrInvalidEvent.
func PLDEventEpsilon(e Event, count int64, delta float64) (float64, error) {
	s, err := pldStepOf(e)
	if err != nil {
		return 0, err
	}
	s.Count = count
	return PLDEpsilonEvents([]PLDEvent{s}, delta)
}

// PLDCalibrateSigma returns the smallest noise multiplier σ (to relative
// precision 1e-6) such that steps runs of the Poisson-subsampled Gaussian
// mechanism with rate q reach a PLD ε ≤ targetEps at δ. The returned σ is
// the upper end of the final bisection bracket, so its PLD ε never exceeds
// the target. It returns ErrUnreachable if σ = 1e4 does not reach the
// target and ErrInvalidParameter for bad inputs.
func PLDCalibrateSigma(targetEps, q float64, steps int64, delta float64) (float64, error) {
	if err := checkParams(q, steps, delta); err != nil {
		return 0, err
	}
	return PLDCalibrate(targetEps, steps, delta, func(sigma float64) Event { return SubsampledGaussian(q, sigma) })
}

// PLDCalibrate is PLDCalibrateSigma for the event the ledger will charge
// for each step of a run with noise multiplier σ: a (Poisson-sampled)
// Gaussian or discrete Gaussian with its lattice (DiscreteGaussianLattice),
// whose PLD ε must be non-increasing in σ, as it is when the noise grows
// with σ. An event the PLD accountant cannot charge is ErrInvalidEvent.
func PLDCalibrate(targetEps float64, steps int64, delta float64, event func(sigma float64) Event) (float64, error) {
	if err := checkParams(1, steps, delta); err != nil {
		return 0, err
	}
	if !(targetEps > 0) || math.IsInf(targetEps, 0) {
		return 0, fmt.Errorf("%w: target epsilon %v must be positive and finite", ErrInvalidParameter, targetEps)
	}
	if _, err := pldStepOf(event(1)); err != nil {
		return 0, err
	}
	eps := func(sigma float64) float64 {
		e, err := PLDEventEpsilon(event(sigma), steps, delta)
		if err != nil {
			return math.Inf(1)
		}
		return e
	}
	// Bracket: RDP's σ is a good upper start (RDP's ε is larger), and the
	// PLD σ is rarely below a third of it.
	hi := 1.0
	if s, err := Calibrate(nil, targetEps, steps, delta, event); err == nil {
		hi = s
	}
	for eps(hi) > targetEps {
		if hi >= maxSigma {
			return 0, fmt.Errorf("%w: ε=%v at δ=%v needs σ > %v for %d steps of %s", ErrUnreachable, targetEps, delta, maxSigma, steps, describe(event(hi)))
		}
		hi = math.Min(hi*2, maxSigma)
	}
	lo := hi / 1.5
	for lo > minSigma && eps(lo) <= targetEps {
		hi, lo = lo, lo/1.5
	}
	if lo <= minSigma {
		return hi, nil
	}
	// Invariant: eps(lo) > target ≥ eps(hi). Each PLD evaluation costs an
	// FFT, so shrink the bracket by regula falsi on log ε (smooth in σ) with
	// the Illinois modification (Dowell and Jarratt 1971), falling back to
	// bisection when an interpolated point lands at an end.
	fLo, fHi := math.Log(eps(lo)/targetEps), math.Log(eps(hi)/targetEps)
	side := 0
	for hi-lo > 1e-6*hi {
		mid := lo + (hi-lo)/2
		if fLo > fHi && !math.IsInf(fLo, 0) && !math.IsInf(fHi, 0) {
			x := hi - fHi*(hi-lo)/(fHi-fLo)
			if x > lo && x < hi {
				mid = x
			}
		}
		f := math.Log(eps(mid) / targetEps)
		if f <= 0 {
			hi, fHi = mid, f
			if side == 1 {
				fLo /= 2
			}
			side = 1
		} else {
			lo, fLo = mid, f
			if side == -1 {
				fHi /= 2
			}
			side = -1
		}
		// Step just across a converging end so the bracket itself shrinks.
		if hi-lo > 1e-6*hi && side == 1 {
			if x := hi * (1 - 5e-7); x > lo {
				if f := math.Log(eps(x) / targetEps); f > 0 {
					lo, fLo = x, f
				}
			}
		}
	}
	return hi, nil
}

// pldDirection is one of the two ordered pairs of the mechanism.
type pldDirection int

const (
	pldRemove pldDirection = iota // P = M, Q = μ0
	pldAdd                        // P = μ0, Q = M
)

// pldWindow is the composition grid: N points ℓ_i = (lo+i)·h, and the tilt.
type pldWindow struct {
	h      float64
	lo     int64 // grid index of the window's first point
	n      int
	lambda float64 // the tilt
	tTop   float64 // the Chernoff exponent at the window's top
}

// chernoffLogMGF returns Σ count·t·D_{1+t}(M‖μ0), the log moment generating
// function at t of the composed remove-direction loss (Mironov, Talwar,
// Zhang 2019: E_M[(M/μ0)^t] = A_{1+t}); it also bounds the add direction's
// (Mironov et al. 2019, Sec. 3.3: B_α ≤ A_α). Used only to place the window
// and choose the tilt; rigour comes from (3) on the discretized PLD.
func chernoffLogMGF(events []PLDEvent, t float64) float64 {
	s := 0.0
	for _, e := range events {
		s += float64(e.Count) * t * SubsampledGaussianRDP(e.SampleRate, e.NoiseMultiplier, 1+t)
	}
	return s
}

// chernoffQuantile returns min_t (K(t) + log(1/tau))/t and its minimizer:
// the Chernoff bound's loss level above which the composed loss has
// probability at most tau.
func chernoffQuantile(events []PLDEvent, tau float64) (level, t float64) {
	f := func(lt float64) float64 {
		t := math.Exp(lt)
		return (chernoffLogMGF(events, t) - math.Log(tau)) / t
	}
	// Golden-section search on log t over [1e-4, 2e3]; f is unimodal in t
	// (K convex, K(0) = 0).
	a, b := math.Log(1e-4), math.Log(2e3)
	g := (math.Sqrt(5) - 1) / 2
	c, d := b-g*(b-a), a+g*(b-a)
	fc, fd := f(c), f(d)
	for i := 0; i < 60; i++ {
		if fc < fd {
			b, d, fd = d, c, fc
			c = b - g*(b-a)
			fc = f(c)
		} else {
			a, c, fc = c, d, fd
			d = a + g*(b-a)
			fd = f(d)
		}
	}
	lt := (a + b) / 2
	return f(lt), math.Exp(lt)
}

// pldWindowFor places the composition window and picks the tilt for
// queries at delta (heuristics: validity does not depend on them) for any
// counts between those of lo and hi (the same events), with 2^fine times
// the points the rule below gives (0 but in tests).
func pldWindowFor(lo, hi []PLDEvent, delta float64, fine int) pldWindow {
	// The answer is near the Chernoff level at δ; the window reaches the
	// level at δ·1e-12 above (for hi's counts) and twice as far below the
	// mean (for lo's).
	_, lambda := chernoffQuantile(hi, delta)
	top, tTop := chernoffQuantile(hi, delta*1e-12)
	const ts = 1e-4
	mean := chernoffLogMGF(hi, ts) / ts // ≈ Σ count·KL
	meanLo := mean
	topLo := top
	if !slices.Equal(lo, hi) {
		meanLo = chernoffLogMGF(lo, ts) / ts
		topLo, _ = chernoffQuantile(lo, delta*1e-12)
	}
	bottom := math.Max(meanLo-2*(topLo-meanLo), -80)
	if top-bottom < 1e-9 {
		bottom, top = bottom-1e-9, top+1e-9
	}
	// N: at least 2^pldWindowBits, and enough that the discretization's
	// O(T·h²/8) upward drift of the composed mean stays below 5e-5 of
	// the window's upper reach (top − mean), up to 2^pldMaxWindowBits.
	var steps float64
	for _, e := range hi {
		steps += float64(e.Count)
	}
	n := 1 << pldWindowBits
	if reach := top - mean; reach > 0 {
		hMax := math.Sqrt(4e-4 * reach / steps)
		for n < 1<<pldMaxWindowBits && (top-bottom)/float64(n-1) > hMax {
			n *= 2
		}
	}
	n <<= fine
	h := (top - bottom) / float64(n-1)
	return pldWindow{h: h, lo: int64(math.Floor(bottom / h)), n: n, lambda: lambda, tTop: tTop}
}

// stepPLD is one event's discretized PLD on the grid: finite masses at
// ℓ = (first+k)·h, and the atom at +∞.
type stepPLD struct {
	first int64
	mass  []float64
	inf   float64
}

// xOf returns the x at which 1−q+q·e^{(2x−1)/(2σ²)} = e^v, or −∞ if
// e^v ≤ 1−q: the inverse of the remove-direction loss.
func xOf(q, sigma, v float64) float64 {
	if q == 1 {
		return sigma*sigma*v + 0.5
	}
	em := math.Expm1(v) + q // e^v − 1 + q
	if !(em > 0) {
		return math.Inf(-1)
	}
	return sigma*sigma*(math.Log(em)-math.Log(q)) + 0.5
}

// lossOf returns the remove-direction loss at x, log(1−q+q·e^{(2x−1)/(2σ²)}).
func lossOf(q, sigma, x float64) float64 {
	z := (2*x - 1) / (2 * sigma * sigma)
	if q == 1 {
		return z
	}
	// log(1−q+q e^z) = logAdd(log(1−q), log q + z)
	return logAdd(math.Log1p(-q), math.Log(q)+z)
}

// normUpper returns P(N(0,1) > z), accurate in the upper tail.
func normUpper(z float64) float64 { return 0.5 * math.Erfc(z/math.Sqrt2) }

// tails returns P(L > v) and Q(L > v) for the direction, with their
// complements where those are the accurate side: upper reports whether the
// returned pair is the upper tail (P(L>v), Q(L>v)) or the lower
// (P(L≤v), Q(L≤v)).
func tails(dir pldDirection, q, sigma, v float64, upper bool) (pm, qm float64) {
	sf := func(z float64) float64 { // upper tail
		if upper {
			return normUpper(z)
		}
		return normUpper(-z)
	}
	if dir == pldRemove {
		// L > v ⇔ x > x*; P = M, Q = μ0.
		x := xOf(q, sigma, v)
		if math.IsInf(x, -1) {
			if upper {
				return 1, 1
			}
			return 0, 0
		}
		pu := (1-q)*sf(x/sigma) + q*sf((x-1)/sigma)
		qu := sf(x / sigma)
		return pu, qu
	}
	// add: L > v ⇔ log(1−q+q e^z) < −v ⇔ x < x*(−v); P = μ0, Q = M.
	x := xOf(q, sigma, -v)
	if math.IsInf(x, -1) { // L ≤ −log(1−q) < ... : L > v impossible
		if upper {
			return 0, 0
		}
		return 1, 1
	}
	// P(x < x*) is the "upper" side in loss; flip the Gaussian tail.
	lf := func(z float64) float64 { return sf(-z) }
	pu := lf(x / sigma)
	qu := (1-q)*lf(x/sigma) + q*lf((x-1)/sigma)
	return pu, qu
}

// buildStep discretizes one step's PLD in direction dir onto the grid of
// spacing h by (2), over grid indices [jlo, jhi].
func buildStep(dir pldDirection, q, sigma, h float64, jlo, jhi int64) stepPLD {
	n := int(jhi - jlo + 1)
	mass := make([]float64, n)
	eh := math.Expm1(h)
	// Upper-tail masses S(ℓ) are accurate where small; lower-tail F(ℓ)
	// where S is near 1. Switch at the median of P's loss.
	prevP, prevQ := 0.0, 0.0 // cumulative from below at the current point
	usingUpper := false
	var upP, upQ float64 // upper tails at the current point, when usingUpper
	{
		p, qq := tails(dir, q, sigma, float64(jlo)*h, true)
		if p < 0.5 {
			usingUpper, upP, upQ = true, p, qq
		} else {
			prevP, prevQ = tails(dir, q, sigma, float64(jlo)*h, false)
		}
	}
	// Everything at or below ℓ_lo goes to ℓ_lo (pessimistic move up).
	if usingUpper {
		mass[0] = 1 - upP
	} else {
		mass[0] = prevP
	}
	for k := 0; k < n-1; k++ {
		v := float64(jlo+int64(k)+1) * h
		var pI, qI float64
		if !usingUpper {
			up, uq := tails(dir, q, sigma, v, true)
			if up < 0.5 {
				// Switch to upper tails from here on.
				fp, fq := 1-up, 1-uq
				pI, qI = fp-prevP, fq-prevQ
				usingUpper, upP, upQ = true, up, uq
			} else {
				fp, fq := tails(dir, q, sigma, v, false)
				pI, qI = fp-prevP, fq-prevQ
				prevP, prevQ = fp, fq
			}
		} else {
			up, uq := tails(dir, q, sigma, v, true)
			pI, qI = upP-up, upQ-uq
			upP, upQ = up, uq
		}
		a, b := splitInterval(pI, qI, v, h, eh)
		mass[k] += a
		mass[k+1] += b
	}
	// Top interval (ℓ_hi, ∞): a = e^{ℓ_hi}·Q(L > ℓ_hi) at ℓ_hi, the rest
	// δ(ℓ_hi) at +∞.
	var topP, topQ float64
	if usingUpper {
		topP, topQ = upP, upQ
	} else {
		fp, fq := prevP, prevQ
		topP, topQ = 1-fp, 1-fq
	}
	a := 0.0
	if topQ > 0 && topP > 0 {
		a = math.Min(topP, math.Exp(float64(jhi)*h+math.Log(topQ)))
	}
	mass[n-1] += a
	for k := range mass {
		if !(mass[k] > 0) {
			mass[k] = 0
		}
	}
	return stepPLD{first: jlo, mass: mass, inf: math.Max(topP-a, 0)}
}

// splitInterval splits an interval (v−h, v] of P-mass p and Q-mass r onto
// its ends by (2), returning the masses at v−h and v.
func splitInterval(p, r, v, h, eh float64) (lower, upper float64) {
	if !(p > 0) {
		return 0, 0
	}
	if !(r > 0) {
		return 0, p
	}
	// t = log(e^{v}·r/p) ∈ [0, h] in exact arithmetic.
	t := v + math.Log(r) - math.Log(p)
	t = math.Min(math.Max(t, 0), h)
	lower = p * math.Expm1(t) / eh
	return lower, p - lower
}

// stepRange returns the grid indices [jlo, jhi] for one event's step:
// beyond gaussTail standard deviations of x (where the Gaussian tails
// underflow) and, where losses are bounded on one side, no further than the
// window can use.
func (w pldWindow) stepRange(events []PLDEvent, i int, dir pldDirection) (jlo, jhi int64) {
	e := events[i]
	q, s := e.SampleRate, e.NoiseMultiplier
	// Natural range of L over x within gaussTail σ of both means.
	lA, lB := lossOf(q, s, -gaussTail*s), lossOf(q, s, 1+gaussTail*s)
	if dir == pldAdd {
		lA, lB = -lB, -lA
	}
	// Sums of the other steps' extreme losses, where finite, bound how far
	// this step's loss can usefully reach.
	var othersMin, othersMax float64
	for k, o := range events {
		c := float64(o.Count)
		if k == i {
			c--
		}
		if c == 0 {
			continue
		}
		bound := math.Log1p(-o.SampleRate) // remove: L ≥ log(1−q); add: L ≤ −log(1−q)
		if dir == pldRemove {
			othersMin += c * bound
			othersMax = math.Inf(1)
		} else {
			othersMax += c * -bound
			othersMin = math.Inf(-1)
		}
	}
	wlo := float64(w.lo) * w.h
	whi := float64(w.lo+int64(w.n)-1) * w.h
	if !math.IsInf(othersMin, -1) {
		lB = math.Min(lB, whi-othersMin+w.h)
	}
	if !math.IsInf(othersMax, 1) {
		lA = math.Max(lA, wlo-othersMax-w.h)
	}
	if lB < lA {
		lB = lA
	}
	jlo = int64(math.Floor(lA / w.h))
	jhi = int64(math.Ceil(lB / w.h))
	if jhi-jlo+1 > pldMaxStep {
		jhi = jlo + pldMaxStep - 1 // the rest goes pessimistically to +∞
	}
	return jlo, jhi
}

// composedPLD is the composition of some events in one direction on a
// window: finite masses at ℓ_i = (w.lo+i)·h and the atom at +∞ (including
// the bound (3) on the finite mass above the window).
type composedPLD struct {
	w    pldWindow
	mass []float64
	inf  float64
	// tailA[i] = Σ_{k>i} mass[k] and tailB[i] = Σ_{k>i} mass[k]·e^{ℓ_i−ℓ_k}
	// (solve's δ(ℓ_i) = tailA[i] − tailB[i]), summed from the top.
	tailA, tailB []float64
}

// tails fills c's suffix sums: b_i = e^{−h}·(m_{i+1} + b_{i+1}).
func (c *composedPLD) tails() {
	n := len(c.mass)
	c.tailA, c.tailB = make([]float64, n), make([]float64, n)
	rho := math.Exp(-c.w.h)
	for i := n - 2; i >= 0; i-- {
		c.tailA[i] = c.tailA[i+1] + c.mass[i+1]
		c.tailB[i] = rho * (c.tailB[i+1] + c.mass[i+1])
	}
}

// compose composes events in direction dir from their prepared steps
// (prep.steps[dir], in the same order as events).
func (prep *pldPrepared) compose(events []PLDEvent, dir pldDirection) composedPLD {
	w := prep.w
	n := w.n
	fft := getFFT(n)
	defer putFFT(fft)
	spec := make([]complex128, n/2+1)
	for i := range spec {
		spec[i] = 1
	}
	logScale := 0.0 // Σ count·log Z
	logFinite := 0.0
	var shift int64 // Σ count·first: the composed grid index of cell 0
	for i, e := range events {
		ps := &prep.steps[dir][i]
		c := float64(e.Count)
		logScale += c * ps.logZ
		logFinite += c * ps.logFinite
		shift += e.Count * ps.first
		for k := range spec {
			// v^c = |v|^c·e^{i·c·arg v}, through polar form so that large
			// c neither overflows nor loses the phase; coefficients whose
			// power underflows skip the rotation.
			r := math.Exp(c * ps.logAbs[k])
			if r == 0 {
				spec[k] = 0
				continue
			}
			spec[k] *= cmplx.Rect(r, math.Mod(c*ps.phase[k], 2*math.Pi))
		}
	}
	seq := make([]float64, n)
	fft.Sequence(seq, spec)
	// Cell i of the cyclic result holds composed grid index ≡ shift+i (mod
	// n); read it out on the window [w.lo, w.lo+n).
	mass := make([]float64, n)
	off := mod(w.lo-shift, int64(n))
	for i := range mass {
		r := seq[(int64(i)+off)%int64(n)] / float64(n)
		if !(r > 0) {
			continue
		}
		l := float64(w.lo+int64(i)) * w.h
		if x := logScale - w.lambda*l; x < 700 {
			mass[i] = r * math.Exp(x)
		} else {
			mass[i] = math.Exp(math.Log(r) + x)
		}
	}
	// Atom at +∞: composed infinite mass plus the bound (3) on the finite
	// mass above the window, minimized over the exponents λ and tTop.
	inf := -math.Expm1(logFinite)
	top := float64(w.lo+int64(n)) * w.h
	best := 1.0
	for j, t := range []float64{w.lambda, w.tTop} {
		if !(t > 0) {
			continue
		}
		k := 0.0
		for i, e := range events {
			k += float64(e.Count) * prep.steps[dir][i].cgf[j]
		}
		best = math.Min(best, math.Exp(k-t*top))
	}
	c := composedPLD{w: w, mass: mass, inf: inf + best}
	c.tails()
	return c
}

// pldPrepared is the part of a PLD evaluation that does not depend on the
// events' exact counts: the window, placed for the counts rounded up to
// powers of two (pldShape), and each event's discretized step PLD on it,
// tilted and Fourier-transformed, in both directions. A run of identical
// steps evaluated at many counts (the ledger's count grid, the step-limit
// search) prepares once per power of two and then pays only the pointwise
// power, one inverse FFT and the solve per count: about a third of the
// whole. Read-only once built; shared through pldPrepCache.
type pldPrepared struct {
	w     pldWindow
	steps [2][]preparedStep // by pldDirection, then event
	rdp   [][]float64       // by event: one step's RDP over DefaultOrders (rdpEpsilon)
	size  int               // bytes held, for the cache's bound
	// wide marks, in the cache, a bucket whose window would be too wide to
	// share (pldPrepare); such an entry holds nothing else.
	wide bool
}

// preparedStep is one event's step PLD in one direction on the window.
type preparedStep struct {
	// logAbs and phase are the real FFT of the tilted masses (folded
	// modulo N) in polar form, log|v| and arg v.
	logAbs, phase []float64
	logZ          float64    // log of the tilt's normalizer
	logFinite     float64    // log(1 − the step's atom at +∞)
	first         int64      // grid index of the step's first mass
	cgf           [2]float64 // K(s) of the finite part at s = λ and s = tTop, for (3)
}

// pldShape returns the bucket of counts events falls in: events with
// each count rounded down to a power of two, plus one (lo), and up to one
// (hi). A window placed for a bucket (pldWindowFor(lo, hi)) serves every
// count in it, so all of them can share one pldPrepared.
func pldShape(events []PLDEvent) (lo, hi []PLDEvent) {
	lo, hi = slices.Clone(events), slices.Clone(events)
	for i := range hi {
		c := int64(1)
		for c < hi[i].Count && c < 1<<62 {
			c <<= 1
		}
		hi[i].Count = c
		lo[i].Count = min(c/2+1, c)
	}
	return lo, hi
}

// rdpEpsilon is the RDP accountant's ε for the same events (the fallback
// when the PLD window cannot bracket the answer, and the cap for discrete
// events; RDP is also an upper bound), from the prepared per-step curves:
// the discrete ones with the discrete Gaussian's RDP bound. +Inf if the
// conversion fails.
func (prep *pldPrepared) rdpEpsilon(events []PLDEvent, delta float64) float64 {
	orders := DefaultOrders()
	rdp := make([]float64, len(orders))
	for i, e := range events {
		for j, r := range prep.rdp[i] {
			rdp[j] += float64(e.Count) * r
		}
	}
	eps, _, err := RDPToEpsilon(orders, rdp, delta)
	if err != nil {
		return math.Inf(1)
	}
	return eps
}

// pldPrepare returns the prepared composition of events at δ (window
// 2^fine times as fine as the rule, for tests), from the cache or built.
// It uses the window of the events' bucket of counts (pldShape), unless
// that window's spacing is more than twice that of the window for the
// bucket's top counts alone (the loss's mean moves more within the bucket
// than the loss spreads, and the points are capped: long runs at large
// q), where each count gets the window of its own counts.
func pldPrepare(events []PLDEvent, delta float64, fine int) *pldPrepared {
	lo, hi := pldShape(events)
	suffix := string(rune('0' + fine))
	bucket := pldMemoKey(hi, delta) + suffix
	p := pldPrepCache.get(bucket)
	if p != nil && !p.wide {
		return p
	}
	shape, key := hi, bucket
	var w pldWindow
	if p == nil {
		w = pldWindowFor(lo, hi, delta, fine)
		if top := pldWindowFor(hi, hi, delta, fine); w.h > 2*top.h {
			pldPrepCache.put(bucket, &pldPrepared{wide: true})
			p = &pldPrepared{wide: true}
		}
	}
	if p != nil { // a wide bucket: every count gets a window of its own
		shape, key = events, pldMemoKey(events, delta)+suffix
		if p := pldPrepCache.get(key); p != nil {
			return p
		}
		w = pldWindowFor(events, events, delta, fine)
	}
	p = &pldPrepared{w: w}
	fft := fourier.NewFFT(w.n)
	seq := make([]float64, w.n)
	coef := make([]complex128, w.n/2+1)
	for _, dir := range []pldDirection{pldRemove, pldAdd} {
		p.steps[dir] = make([]preparedStep, len(shape))
		for i, e := range shape {
			jlo, jhi := w.stepRange(shape, i, dir)
			st := buildStep(dir, e.SampleRate, e.NoiseMultiplier, w.h, jlo, jhi)
			// Tilt: p_k e^{λℓ_k}/Z, folded modulo n.
			ps := preparedStep{logZ: st.tilt(seq, w.lambda, w.h), logFinite: math.Log1p(-st.inf), first: st.first,
				logAbs: make([]float64, len(coef)), phase: make([]float64, len(coef))}
			fft.Coefficients(coef, seq)
			for k, v := range coef {
				ps.logAbs[k], ps.phase[k] = math.Log(cmplx.Abs(v)), cmplx.Phase(v)
			}
			for j, t := range []float64{w.lambda, w.tTop} {
				if t > 0 {
					ps.cgf[j] = st.tilt(nil, t, w.h)
				}
			}
			p.steps[dir][i] = ps
			p.size += 16 * len(coef)
		}
	}
	for _, e := range shape {
		p.rdp = append(p.rdp, keyOf(e).rdpCurve())
	}
	pldPrepCache.put(key, p)
	return p
}

// fftPlans keeps FFT plans (their twiddle factors) by size: a plan is
// not safe for concurrent use, so each caller takes one and puts it back.
var fftPlans sync.Map // int → *sync.Pool of *fourier.FFT

func getFFT(n int) *fourier.FFT {
	p, _ := fftPlans.LoadOrStore(n, &sync.Pool{New: func() any { return fourier.NewFFT(n) }})
	return p.(*sync.Pool).Get().(*fourier.FFT)
}

func putFFT(f *fourier.FFT) {
	if p, ok := fftPlans.Load(f.Len()); ok {
		p.(*sync.Pool).Put(f)
	}
}

// pldPrepCache holds recently prepared compositions, up to
// pldPrepCacheBytes of Fourier coefficients (cleared when full).
var pldPrepCache prepCache

const pldPrepCacheBytes = 64 << 20

type prepCache struct {
	sync.Mutex
	m    map[string]*pldPrepared
	size int
}

func (c *prepCache) get(key string) *pldPrepared {
	c.Lock()
	defer c.Unlock()
	return c.m[key]
}

func (c *prepCache) put(key string, p *pldPrepared) {
	c.Lock()
	defer c.Unlock()
	if c.m == nil || c.size+p.size > pldPrepCacheBytes {
		c.m, c.size = map[string]*pldPrepared{}, 0
	}
	if p.size <= pldPrepCacheBytes {
		c.m[key] = p
		c.size += p.size
	}
}

// solve solves (1) for the smallest ε ≥ 0 with δ(ε) ≤ delta, or returns
// ok = false if the window cannot bracket it.
func (c composedPLD) solve(delta float64) (eps float64, ok bool) {
	w, n := c.w, c.w.n
	rest := delta - c.inf
	if !(rest > 0) {
		return 0, false
	}
	// δ(ℓ_i) is non-increasing in i: binary search the last grid point
	// with δ > rest, then solve inside the cell. δ(ℓ_i) = a_i − b_i with
	// a_i = Σ_{k>i} m_k and b_i = Σ_{k>i} m_k e^{ℓ_i−ℓ_k}, the suffix sums
	// compose computed (tails).
	deltaAt := func(i int) (a, b float64) { return c.tailA[i], c.tailB[i] }
	if a, b := deltaAt(0); a-b <= rest {
		return math.Max(float64(w.lo)*w.h, 0), true
	}
	if a, b := deltaAt(n - 1); a-b > rest {
		return 0, false
	}
	lo, hi := 0, n-1 // δ(lo) > rest ≥ δ(hi)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if a, b := deltaAt(mid); a-b > rest {
			lo = mid
		} else {
			hi = mid
		}
	}
	// On (ℓ_lo, ℓ_lo+h], δ(ℓ_lo+u) = A − e^u·B with A, B the sums over
	// k > lo (the mass at ℓ_hi is included: it is > ε there).
	a, b := deltaAt(lo)
	u := w.h
	if b > 0 && a-rest > 0 {
		u = math.Min(math.Max(math.Log((a-rest)/b), 0), w.h)
	}
	return math.Max(float64(w.lo+int64(lo))*w.h+u, 0), true
}

func mod(a, n int64) int64 {
	a %= n
	if a < 0 {
		a += n
	}
	return a
}

// tilt returns log Σ_k m_k e^{sℓ_k} (K(s) of the finite part) and, if dst
// is not nil, writes the tilted, normalized masses m_k e^{sℓ_k}/e^{K(s)}
// into dst, folded modulo len(dst) from the step's first grid point.
func (st stepPLD) tilt(dst []float64, s, h float64) float64 {
	// Normalize by the largest term, in log space, so nothing overflows.
	// log m_k + s·ℓ_k is concave-ish in k but we take the plain maximum.
	maxLog := math.Inf(-1)
	for k, m := range st.mass {
		if m > 0 {
			maxLog = math.Max(maxLog, math.Log(m)+s*float64(st.first+int64(k))*h)
		}
	}
	if dst != nil {
		clear(dst)
	}
	z := 0.0
	n := len(dst)
	for k, m := range st.mass {
		if m > 0 {
			v := math.Exp(math.Log(m) + s*float64(st.first+int64(k))*h - maxLog)
			z += v
			if dst != nil {
				dst[k%n] += v
			}
		}
	}
	for k := range dst {
		dst[k] /= z
	}
	return maxLog + math.Log(z)
}

package ledger

import (
	"fmt"
	"math"
	"slices"
)

// Accountant accumulates the Rényi DP of composed events over a fixed set of
// orders. RDP composes additively per order (Mironov 2017, Prop. 1), so the
// state is one number per order.
//
// An Accountant is not safe for concurrent use. The zero value is not
// usable; call NewAccountant.
type Accountant struct {
	orders []float64
	rdp    []float64
	// cache remembers the per-order RDP of each subsampled mechanism seen,
	// so that charging the same mechanism at every step costs
	// O(len(orders)).
	cache map[curveKey][]float64
}

// curveKey names one Poisson-subsampled mechanism's RDP curve.
type curveKey struct {
	kind     Kind
	q, sigma float64
}

// NewAccountant returns an accountant over the given orders, or over
// DefaultOrders if orders is empty. Every order must be > 1.
func NewAccountant(orders []float64) (*Accountant, error) {
	if len(orders) == 0 {
		orders = DefaultOrders()
	}
	for _, a := range orders {
		if !(a > 1) || math.IsInf(a, 0) {
			return nil, fmt.Errorf("%w: Rényi order %v must be finite and > 1", ErrInvalidParameter, a)
		}
	}
	return &Accountant{
		orders: slices.Clone(orders),
		rdp:    make([]float64, len(orders)),
		cache:  make(map[curveKey][]float64),
	}, nil
}

// Orders returns the accountant's Rényi orders. The caller must not modify
// the result.
func (a *Accountant) Orders() []float64 { return a.orders }

// RDP returns the accumulated RDP, one value per order. The caller must not
// modify the result.
func (a *Accountant) RDP() []float64 { return a.rdp }

// Compose charges event e, count times. It returns an error, and charges
// nothing, if e does not validate or count is negative.
func (a *Accountant) Compose(e Event, count int64) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if count < 0 {
		return fmt.Errorf("%w: negative count %d", ErrInvalidParameter, count)
	}
	delta := make([]float64, len(a.orders))
	if err := a.eventRDP(delta, e, float64(count)); err != nil {
		return err
	}
	for i := range a.rdp {
		a.rdp[i] += delta[i]
	}
	return nil
}

// eventRDP adds weight × RDP(e) to dst, per order.
func (a *Accountant) eventRDP(dst []float64, e Event, weight float64) error {
	switch e.Kind {
	case KindGaussian, KindDiscreteGaussian:
		// Plain Gaussian mechanism: RDP(α) = α/(2σ²) (Mironov 2017, Prop. 7).
		// The discrete Gaussian on an integer query has at most the same at
		// every real α ≥ 1 (see SubsampledDiscreteGaussianRDP).
		for i, o := range a.orders {
			dst[i] += weight * o / (2 * e.NoiseMultiplier * e.NoiseMultiplier)
		}
	case KindPoissonSampled:
		if e.Event.Kind != KindGaussian && e.Event.Kind != KindDiscreteGaussian {
			return fmt.Errorf("%w: the RDP accountant supports Poisson sampling only of the Gaussian mechanisms, not %q", ErrInvalidEvent, e.Event.Kind)
		}
		curve := a.subsampled(e.Event.Kind, e.SampleRate, e.Event.NoiseMultiplier)
		for i := range dst {
			dst[i] += weight * curve[i]
		}
	case KindSelfComposed:
		return a.eventRDP(dst, *e.Event, weight*float64(e.Count))
	case KindComposed:
		for _, sub := range e.Events {
			if err := a.eventRDP(dst, sub, weight); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: unknown kind %q", ErrInvalidEvent, e.Kind)
	}
	return nil
}

func (a *Accountant) subsampled(kind Kind, q, sigma float64) []float64 {
	key := curveKey{kind, q, sigma}
	if c, ok := a.cache[key]; ok {
		return c
	}
	rdp := SubsampledGaussianRDP
	if kind == KindDiscreteGaussian {
		rdp = SubsampledDiscreteGaussianRDP
	}
	c := make([]float64, len(a.orders))
	for i, o := range a.orders {
		c[i] = rdp(q, sigma, o)
	}
	a.cache[key] = c
	return c
}

// Epsilon returns the ε of everything composed so far at the given δ, and
// the Rényi order that attains it (Balle et al. 2020, Thm. 21; see
// RDPToEpsilon).
func (a *Accountant) Epsilon(delta float64) (eps, order float64, err error) {
	return RDPToEpsilon(a.orders, a.rdp, delta)
}

// Reset forgets everything composed so far.
func (a *Accountant) Reset() { clear(a.rdp) }

// Epsilon is a convenience for the common DP-SGD question: the ε, at δ, of
// steps runs of the Poisson-subsampled Gaussian mechanism with rate q and
// noise multiplier sigma, over DefaultOrders. It validates its inputs.
func Epsilon(q, sigma float64, steps int64, delta float64) (eps, order float64, err error) {
	return EpsilonOrders(nil, q, sigma, steps, delta)
}

// EpsilonOrders is Epsilon over the given orders (DefaultOrders if nil).
func EpsilonOrders(orders []float64, q, sigma float64, steps int64, delta float64) (eps, order float64, err error) {
	if err := checkParams(q, steps, delta); err != nil {
		return 0, 0, err
	}
	if !(sigma > 0) || math.IsInf(sigma, 0) {
		return 0, 0, fmt.Errorf("%w: noise multiplier %v must be positive and finite", ErrInvalidParameter, sigma)
	}
	return EventEpsilon(orders, SubsampledGaussian(q, sigma), steps, delta)
}

// EventEpsilon returns the ε, at δ, of count runs of event e over the given
// orders (DefaultOrders if nil), and the order that attains it.
func EventEpsilon(orders []float64, e Event, count int64, delta float64) (eps, order float64, err error) {
	acc, err := NewAccountant(orders)
	if err != nil {
		return 0, 0, err
	}
	if err := acc.Compose(e, count); err != nil {
		return 0, 0, err
	}
	return acc.Epsilon(delta)
}

func checkParams(q float64, steps int64, delta float64) error {
	switch {
	case !(q > 0 && q <= 1):
		return fmt.Errorf("%w: sample rate %v must be in (0, 1]", ErrInvalidParameter, q)
	case steps < 1:
		return fmt.Errorf("%w: steps %d must be at least 1", ErrInvalidParameter, steps)
	case !(delta > 0 && delta < 1):
		return fmt.Errorf("%w: delta %v must be in (0, 1)", ErrInvalidParameter, delta)
	}
	return nil
}

// Calibration bounds: the search for σ covers [minSigma, maxSigma].
const (
	minSigma = 1e-3
	maxSigma = 1e4
)

// CalibrateSigma returns the smallest noise multiplier σ (to relative
// precision 1e-9) such that steps runs of the Poisson-subsampled Gaussian
// mechanism with rate q reach ε ≤ targetEps at δ, over DefaultOrders (or the
// given orders). It is Calibrate for the event SubsampledGaussian(q, σ).
func CalibrateSigma(orders []float64, targetEps, q float64, steps int64, delta float64) (float64, error) {
	if err := checkParams(q, steps, delta); err != nil {
		return 0, err
	}
	return Calibrate(orders, targetEps, steps, delta, func(sigma float64) Event {
		return SubsampledGaussian(q, sigma)
	})
}

// Calibrate returns the smallest noise multiplier σ in [1e-3, 1e4] (to
// relative precision 1e-9) such that steps runs of event(σ) reach
// ε ≤ targetEps at δ, over DefaultOrders (or the given orders). event must
// be the event the ledger will charge for a run with noise multiplier σ,
// and its ε must be non-increasing in σ (true of every event whose noise
// grows with σ), so bisection applies. The returned σ is always the upper
// end of the final bracket: its ε never exceeds the target. It returns
// ErrUnreachable if even σ = 1e4 does not reach the target (ε that small is
// below what RDP can certify at this δ), and ErrInvalidParameter for a bad
// target, step count or δ.
func Calibrate(orders []float64, targetEps float64, steps int64, delta float64, event func(sigma float64) Event) (float64, error) {
	if err := checkParams(1, steps, delta); err != nil {
		return 0, err
	}
	if !(targetEps > 0) || math.IsInf(targetEps, 0) {
		return 0, fmt.Errorf("%w: target epsilon %v must be positive and finite", ErrInvalidParameter, targetEps)
	}
	if len(orders) == 0 {
		orders = DefaultOrders()
	}
	// With no privacy loss at all (RDP = 0 at every order) the conversion
	// still leaves a floor; a target at or below it is unreachable at any σ.
	floor, _, err := RDPToEpsilon(orders, make([]float64, len(orders)), delta)
	if err != nil {
		return 0, err
	}
	if targetEps <= floor {
		return 0, fmt.Errorf("%w: ε=%v is below the smallest ε (%.4g) these Rényi orders can certify at δ=%v", ErrUnreachable, targetEps, floor, delta)
	}
	eps := func(sigma float64) float64 {
		e, _, err := EventEpsilon(orders, event(sigma), steps, delta)
		if err != nil {
			return math.Inf(1)
		}
		return e
	}
	hi := 1.0
	for eps(hi) > targetEps {
		if hi >= maxSigma {
			return 0, fmt.Errorf("%w: ε=%v at δ=%v needs σ > %v for %d steps of %s", ErrUnreachable, targetEps, delta, maxSigma, steps, describe(event(hi)))
		}
		hi = math.Min(hi*2, maxSigma)
	}
	lo := hi / 2
	for lo > minSigma && eps(lo) <= targetEps {
		hi, lo = lo, lo/2
	}
	if lo <= minSigma {
		return hi, nil
	}
	// Invariant: eps(lo) > target ≥ eps(hi).
	for hi-lo > 1e-9*hi {
		mid := lo + (hi-lo)/2
		if eps(mid) <= targetEps {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// describe names an event's mechanism for error messages.
func describe(e Event) string {
	if e.Kind == KindPoissonSampled && e.Event != nil {
		return fmt.Sprintf("%s with q=%v", e.Event.Kind, e.SampleRate)
	}
	return string(e.Kind)
}

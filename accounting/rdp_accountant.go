package accounting

import (
	"fmt"
	"math"
	"slices"
)

// RDP is the Rényi DP accountant over a fixed set of orders: the Accountant
// whose ε is RDPToEpsilon of the composed per-order RDP (SubsampledGaussianRDP,
// SubsampledDiscreteGaussianRDP). RDP composes additively per order
// (Mironov 2017, Prop. 1). The zero value is the accountant over
// DefaultOrders; NewRDP chooses others. An RDP is immutable and safe for
// concurrent use; the stateful composition is RDPComposition.
type RDP struct {
	orders []float64 // nil: DefaultOrders
}

// NewRDP returns the RDP accountant over the given orders, or over
// DefaultOrders if orders is empty. Every order must be finite and > 1.
func NewRDP(orders []float64) (RDP, error) {
	if len(orders) == 0 {
		orders = DefaultOrders()
	}
	for _, a := range orders {
		if !(a > 1) || math.IsInf(a, 0) {
			return RDP{}, fmt.Errorf("%w: Rényi order %v must be finite and > 1", ErrInvalidParameter, a)
		}
	}
	return RDP{orders: slices.Clone(orders)}, nil
}

// Name returns NameRDP.
func (r RDP) Name() Name { return NameRDP }

// Orders returns the accountant's Rényi orders. The caller must not modify
// the result.
func (r RDP) Orders() []float64 {
	if r.orders == nil {
		return DefaultOrders()
	}
	return r.orders
}

// NewComposition returns an empty composition over r's orders.
func (r RDP) NewComposition() *RDPComposition {
	orders := r.Orders()
	return &RDPComposition{
		orders: orders,
		rdp:    make([]float64, len(orders)),
		cache:  make(map[curveKey][]float64),
	}
}

// Epsilon returns the ε, at δ, of count runs of event e (see EpsilonOrder).
func (r RDP) Epsilon(e Event, count int64, delta float64) (float64, error) {
	eps, _, err := r.EpsilonOrder(e, count, delta)
	return eps, err
}

// EpsilonOrder returns the ε, at δ, of count runs of event e, and the
// Rényi order that attains it (Balle et al. 2020, Thm. 21; see
// RDPToEpsilon).
func (r RDP) EpsilonOrder(e Event, count int64, delta float64) (eps, order float64, err error) {
	c := r.NewComposition()
	if err := c.Compose(e, count); err != nil {
		return 0, 0, err
	}
	return c.Epsilon(delta)
}

// RDPComposition accumulates the Rényi DP of composed events over an RDP
// accountant's orders: one number per order.
//
// An RDPComposition is not safe for concurrent use. The zero value is not
// usable; call RDP.NewComposition.
type RDPComposition struct {
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

// Orders returns the composition's Rényi orders. The caller must not
// modify the result.
func (a *RDPComposition) Orders() []float64 { return a.orders }

// RDP returns the accumulated RDP, one value per order. The caller must not
// modify the result.
func (a *RDPComposition) RDP() []float64 { return a.rdp }

// Clone returns an independent copy of the composition (the curve cache is
// shared: it holds values determined by their keys, but it makes the copy
// and the original unsafe to use concurrently).
func (a *RDPComposition) Clone() *RDPComposition {
	c := *a
	c.rdp = slices.Clone(a.rdp)
	return &c
}

// Compose charges event e, count times. It returns an error, and charges
// nothing, if e does not validate or count is negative.
func (a *RDPComposition) Compose(e Event, count int64) error {
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
func (a *RDPComposition) eventRDP(dst []float64, e Event, weight float64) error {
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

func (a *RDPComposition) subsampled(kind Kind, q, sigma float64) []float64 {
	key := curveKey{kind, q, sigma}
	if c, ok := a.cache[key]; ok {
		return c
	}
	c := subsampledCurve(kind == KindDiscreteGaussian, q, sigma, a.orders)
	a.cache[key] = c
	return c
}

// subsampledCurve returns one run's RDP of the Poisson-subsampled Gaussian
// (discrete: the discrete Gaussian's bound) at each of orders.
func subsampledCurve(discrete bool, q, sigma float64, orders []float64) []float64 {
	rdp := SubsampledGaussianRDP
	if discrete {
		rdp = SubsampledDiscreteGaussianRDP
	}
	c := make([]float64, len(orders))
	for i, o := range orders {
		c[i] = rdp(q, sigma, o)
	}
	return c
}

// Epsilon returns the ε of everything composed so far at the given δ, and
// the Rényi order that attains it (Balle et al. 2020, Thm. 21; see
// RDPToEpsilon).
func (a *RDPComposition) Epsilon(delta float64) (eps, order float64, err error) {
	return RDPToEpsilon(a.orders, a.rdp, delta)
}

// Reset forgets everything composed so far.
func (a *RDPComposition) Reset() { clear(a.rdp) }

// Calibrate returns the smallest σ (to relative precision 1e-9) such that
// steps runs of event(σ) reach ε ≤ target at δ over r's orders, by
// bisection inside the bracket of the common search (Accountant.Calibrate
// states the contract). It returns ErrUnreachable also for a target at or
// below the ε these orders certify for no privacy loss at all (RDP = 0 at
// every order): that floor is what the conversion leaves at δ.
func (r RDP) Calibrate(target float64, steps int64, delta float64, event func(sigma float64) Event) (float64, error) {
	if err := checkCalibration(target, steps, delta); err != nil {
		return 0, err
	}
	// With no privacy loss at all (RDP = 0 at every order) the conversion
	// still leaves a floor; a target at or below it is unreachable at any σ.
	orders := r.Orders()
	floor, _, err := RDPToEpsilon(orders, make([]float64, len(orders)), delta)
	if err != nil {
		return 0, err
	}
	if target <= floor {
		return 0, fmt.Errorf("%w: ε=%v is below the smallest ε (%.4g) these Rényi orders can certify at δ=%v", ErrUnreachable, target, floor, delta)
	}
	s := newSigmaSearch(r, target, steps, delta, event, 1, 2)
	return s.run(s.bisect)
}

// StepLimit returns the largest T ≤ MaxStepLimit with ε(T runs of step) ≤
// target at δ over r's orders, 0 if one run exceeds it, by doubling and
// bisection on T·RDP(step). planned is not needed: each ε costs
// O(len(orders)). A composition that adds RDP(step) T times (a ledger
// charging step by step) rounds differently from T·RDP(step), so at the
// limit its ε may differ from this one in the last bits.
func (r RDP) StepLimit(step Event, target, delta float64, planned int64) (int64, error) {
	c := r.NewComposition()
	if err := c.Compose(step, 1); err != nil {
		return 0, err
	}
	e1, _, err := c.Epsilon(delta)
	if err != nil {
		return 0, err
	}
	if !(e1 <= target) {
		return 0, nil
	}
	return rdpStepLimit(c.Orders(), c.RDP(), delta, target), nil
}

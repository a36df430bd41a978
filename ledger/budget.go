package ledger

import (
	"fmt"
	"math"
	"slices"
)

// Accountants a run record can name: the one whose ε the ledger enforces
// and records for the run.
const (
	// AccountantRDP: the Rényi DP accountant over DefaultOrders (Accountant,
	// RDPToEpsilon). Run records written before accountants were recorded
	// hold "", which means the same.
	AccountantRDP = "rdp"
	// AccountantPLD: the privacy-loss-distribution accountant (ledger/pld.go).
	// It accounts for the (Poisson-subsampled) continuous Gaussian mechanism,
	// and the discrete Gaussian when its event names its lattice
	// (DiscreteGaussianLattice; ledger/pld_discrete.go): a charge of any
	// other event is refused with ErrInvalidEvent.
	AccountantPLD = "pld"
)

// knownAccountant reports whether a run record may name accountant.
func knownAccountant(accountant string) bool {
	return accountant == AccountantRDP || accountant == AccountantPLD || accountant == ""
}

// AccountantSupports reports whether the accountant can charge runs whose
// noise mechanism is mechanism (see MechanismKind): both accountants charge
// both mechanisms; PLD charges the discrete Gaussian's events only when
// they name its lattice (pldStepOf), which runs configured for PLD do.
func AccountantSupports(accountant, mechanism string) bool {
	_, ok := MechanismKind(mechanism)
	return ok && knownAccountant(accountant)
}

// budget is the accountant state of a ledger: the events charged so far,
// composed with the run's accountant. Both implementations are
// deterministic functions of the charged events, in order, so an auditor
// replaying the file gets every recorded ε bit for bit.
type budget interface {
	// exceeds reports whether charging e once more would take ε past
	// target. It changes nothing.
	exceeds(e Event, target float64) (bool, error)
	// add charges e once. Callers check exceeds first.
	add(e Event) error
	// clone returns an independent copy (caches may be shared: they hold
	// values determined by their keys).
	clone() budget
	// epsilon returns the ε recorded for everything charged so far (0 with
	// nothing charged). It is an upper bound on the exact ε (see each
	// implementation).
	epsilon() (float64, error)
}

// newBudget returns the budget of the named accountant at δ; target is the
// run's ε, which the PLD budget precomputes its step limit for.
func newBudget(accountant string, delta, target float64) (budget, error) {
	switch accountant {
	case AccountantRDP, "":
		acc, err := NewAccountant(nil)
		if err != nil {
			return nil, err
		}
		return &rdpBudget{acc: acc, delta: delta}, nil
	case AccountantPLD:
		return &pldBudget{delta: delta, target: target, limit: map[pldKey]int64{},
			eps: map[pldKey]map[int64]float64{}, rdp: map[pldKey][]float64{}}, nil
	}
	return nil, fmt.Errorf("%w: accountant %q must be %q or %q", ErrInvalidParameter, accountant, AccountantRDP, AccountantPLD)
}

// rdpBudget composes with the RDP Accountant: O(len(orders)) per check.
type rdpBudget struct {
	acc   *Accountant
	delta float64
}

func (b *rdpBudget) exceeds(e Event, target float64) (bool, error) {
	saved := slices.Clone(b.acc.rdp)
	defer copy(b.acc.rdp, saved)
	if err := b.acc.Compose(e, 1); err != nil {
		return false, err
	}
	eps, _, err := b.acc.Epsilon(b.delta)
	if err != nil {
		return false, err
	}
	return eps > target, nil
}

func (b *rdpBudget) clone() budget {
	acc := *b.acc
	acc.rdp = slices.Clone(b.acc.rdp)
	return &rdpBudget{acc: &acc, delta: b.delta}
}

func (b *rdpBudget) add(e Event) error { return b.acc.Compose(e, 1) }

func (b *rdpBudget) epsilon() (float64, error) {
	eps, _, err := b.acc.Epsilon(b.delta)
	return eps, err
}

// pldKey names one step mechanism of the PLD budget (dim and scale are
// zero for the continuous Gaussian).
type pldKey struct {
	q, sigma float64
	dim      int64
	scale    float64
}

func keyOf(e PLDEvent) pldKey {
	return pldKey{e.SampleRate, e.NoiseMultiplier, e.Dimension, e.LatticeScale}
}

// event returns n steps of k.
func (k pldKey) event(n int64) PLDEvent {
	return PLDEvent{SampleRate: k.q, NoiseMultiplier: k.sigma, Count: n, Dimension: k.dim, LatticeScale: k.scale}
}

// pldBudget composes with the PLD accountant. One PLD evaluation costs an
// FFT of at least 2^18 points (about 0.1–0.3 s on two cores), so it is
// never done per step for the common case, a run of identical steps:
//
//   - exceeds: for identical steps, the largest count T* whose PLD ε is at
//     most the target is found once per (q, σ, target) by a galloping then
//     binary search over the count (started at the RDP accountant's
//     count, which the PLD one is rarely below), and the check is
//     n + 1 > T*, O(1). Steps with different (q, σ) fall back to composing
//     them all (PLDEpsilonEvents).
//   - epsilon: for n ≤ T* identical steps it is the smaller of two upper
//     bounds on the exact ε: the RDP accountant's ε of the n steps
//     (O(orders)), and the PLD ε at T* (PLD ε is non-decreasing in the
//     count: composition never lowers the privacy loss, so ε(T*) bounds
//     ε(n)). So a run that ends at T* (a calibrated run ending at
//     MaxSteps) records its exact PLD ε, every recorded ε is within the
//     target, and the value depends on T* alone, not on where the search
//     started, which an auditor does not know. No PLD evaluation happens
//     after the first check. Mixed steps compose all events.
type pldBudget struct {
	delta, target float64
	events        []PLDEvent // in first-charged order, one per (q, σ)
	limit         map[pldKey]int64
	eps           map[pldKey]map[int64]float64 // PLD ε at the counts stepLimit evaluated
	rdp           map[pldKey][]float64         // per-step RDP curves
	// planned, if positive, is the run's planned step count (PlanSteps):
	// the step-limit search's first guess. σ is calibrated for exactly
	// that many steps, so T* is planned or just above it, and the search
	// closes its bracket in two evaluations.
	planned int64
}

// pldStepOf returns the PLD event of one step of e: a Poisson-sampled
// Gaussian or discrete Gaussian (or a plain one, q = 1); a discrete
// Gaussian must name its lattice. Other mechanisms are refused.
func pldStepOf(e Event) (PLDEvent, error) {
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
		return PLDEvent{}, fmt.Errorf("%w: the PLD accountant charges a discrete Gaussian only with its lattice (dimension and scale), and %s names none (an event of a run configured for the RDP accountant)", ErrInvalidEvent, describe(e))
	}
	return PLDEvent{}, fmt.Errorf("%w: the PLD accountant charges only the (Poisson-sampled) Gaussian and discrete Gaussian mechanisms, not %s", ErrInvalidEvent, describe(e))
}

// with returns the budget's events plus one step of s.
func (b *pldBudget) with(s PLDEvent) []PLDEvent {
	return addPLDStep(slices.Clone(b.events), s)
}

// addPLDStep adds one step of s to evs, in place where evs has its (q, σ).
func addPLDStep(evs []PLDEvent, s PLDEvent) []PLDEvent {
	for i := range evs {
		if keyOf(evs[i]) == keyOf(s) {
			evs[i].Count++
			return evs
		}
	}
	return append(evs, s)
}

func (b *pldBudget) exceeds(e Event, target float64) (bool, error) {
	s, err := pldStepOf(e)
	if err != nil {
		return false, err
	}
	evs := b.with(s)
	if len(evs) == 1 && target == b.target {
		limit, err := b.stepLimit(keyOf(s))
		if err != nil {
			return false, err
		}
		return evs[0].Count > limit, nil
	}
	eps, err := PLDEpsilonEvents(evs, b.delta)
	if err != nil {
		return false, err
	}
	return eps > target, nil
}

func (b *pldBudget) clone() budget {
	c := *b
	c.events = slices.Clone(b.events)
	return &c
}

func (b *pldBudget) add(e Event) error {
	s, err := pldStepOf(e)
	if err != nil {
		return err
	}
	b.events = b.with(s)
	return nil
}

func (b *pldBudget) epsilon() (float64, error) {
	switch len(b.events) {
	case 0:
		return 0, nil
	case 1:
		ev := b.events[0]
		k := keyOf(ev)
		limit, err := b.stepLimit(k)
		if err != nil {
			return 0, err
		}
		eps := math.Inf(1)
		// The PLD ε at T*, which bounds the ε of every n ≤ T* (PLD ε is
		// non-decreasing in the count). Only T* is used, not the other
		// counts the search evaluated: those depend on where the search
		// started (PlanSteps, which the ledger file does not record), T*
		// does not, so an auditor replaying the file gets the same value.
		if e, ok := b.eps[k][limit]; ok && ev.Count <= limit {
			eps = e
		}
		// The RDP accountant's ε of the n steps, O(len(orders)).
		rdp := b.curve(k)
		scaled := make([]float64, len(rdp))
		for i := range rdp {
			scaled[i] = float64(ev.Count) * rdp[i]
		}
		if e, _, err := RDPToEpsilon(DefaultOrders(), scaled, b.delta); err == nil {
			eps = math.Min(eps, e)
		}
		if math.IsInf(eps, 1) {
			return PLDEpsilonEvents(b.events, b.delta)
		}
		return eps, nil
	}
	return PLDEpsilonEvents(b.events, b.delta)
}

// curve returns the per-step RDP of k over DefaultOrders, cached (the
// discrete Gaussian's bound for a discrete k).
func (b *pldBudget) curve(k pldKey) []float64 {
	if c, ok := b.rdp[k]; ok {
		return c
	}
	orders := DefaultOrders()
	c := make([]float64, len(orders))
	rdp := SubsampledGaussianRDP
	if k.dim > 0 {
		rdp = SubsampledDiscreteGaussianRDP
	}
	for i, o := range orders {
		c[i] = rdp(k.q, k.sigma, o)
	}
	b.rdp[k] = c
	return c
}

// at returns the PLD ε of n steps of k, cached.
func (b *pldBudget) at(k pldKey, n int64) (float64, error) {
	m := b.eps[k]
	if m == nil {
		m = map[int64]float64{}
		b.eps[k] = m
	}
	if eps, ok := m[n]; ok {
		return eps, nil
	}
	eps, err := PLDEpsilonEvents([]PLDEvent{k.event(n)}, b.delta)
	if err != nil {
		return 0, err
	}
	m[n] = eps
	return eps, nil
}

// pldMaxLimit caps the step limit T*: a run of identical steps is refused
// beyond it even if its ε would still be within the target.
const pldMaxLimit = int64(1) << 40

// stepLimit returns T*, the largest count of steps of k whose PLD ε is at
// most the target (0 if one step exceeds it), computed once and cached.
//
// Each PLD evaluation costs an FFT, so the search is a bracketing secant
// on log ε against log T (smooth, close to ε ∝ √T): it starts at the run's
// planned step count if it was given (PlanSteps), else at the RDP
// accountant's step count for the same budget (PLD allows at least about
// as many), extrapolates with ε ∝ √T until the limit is bracketed, then
// interpolates; every guess x is followed by its neighbour on the far side
// (x+1 after an x within the target, x−1 after one above it), which closes
// the bracket when the guess is right, as it usually is within one or two
// rounds. After four rounds it bisects, so it always terminates. It
// assumes PLD ε is non-decreasing in T, which composition guarantees.
func (b *pldBudget) stepLimit(k pldKey) (int64, error) {
	if t, ok := b.limit[k]; ok {
		return t, nil
	}
	eval := func(n int64) (float64, error) { return b.at(k, n) }
	// lo is within the target (or 0), hi above it (or 0: not found yet).
	var lo, hi int64
	var epsLo, epsHi float64
	try := func(n int64) (bool, error) {
		eps, err := eval(n)
		if err != nil {
			return false, err
		}
		if eps <= b.target {
			lo, epsLo = n, eps
			return true, nil
		}
		hi, epsHi = n, eps
		return false, nil
	}
	start := int64(1)
	if b.planned > 0 {
		start = min(b.planned, pldMaxLimit)
	} else if e1, _, err := RDPToEpsilon(DefaultOrders(), b.curve(k), b.delta); err == nil && e1 < b.target {
		start = rdpStepLimit(b.curve(k), b.delta, b.target)
	}
	ok, err := try(start)
	if err != nil {
		return 0, err
	}
	if b.planned > 0 { // a good guess: its neighbour may close the bracket at once
		if ok && start < pldMaxLimit {
			_, err = try(start + 1)
		} else if !ok && start > 1 {
			_, err = try(start - 1)
		}
		if err != nil {
			return 0, err
		}
	}
	for round := 0; hi == 0 || hi-lo > 1; round++ {
		var x int64
		switch {
		case hi == 0 && lo >= pldMaxLimit:
			b.limit[k] = pldMaxLimit
			return pldMaxLimit, nil
		case hi == 0: // extrapolate up with ε ∝ √T, a little beyond
			r := b.target / epsLo
			x = int64(math.Min(math.Ceil(float64(lo)*r*r*1.01)+1, float64(pldMaxLimit)))
			x = max(x, lo+1)
		case round >= 4 || lo == 0 || !(epsLo > 0):
			x = lo + (hi-lo)/2
		default: // secant on (log T, log ε)
			slope := math.Log(epsHi/epsLo) / math.Log(float64(hi)/float64(lo))
			f := float64(lo) * math.Exp(math.Log(b.target/epsLo)/slope)
			if math.IsNaN(f) {
				f = float64(lo + (hi-lo)/2)
			}
			x = int64(math.Min(math.Max(math.Floor(f), float64(lo+1)), float64(hi-1)))
		}
		ok, err := try(x)
		if err != nil {
			return 0, err
		}
		// The neighbour on the far side closes the bracket if x was right.
		if ok && (hi == 0 || hi > x+1) && x < pldMaxLimit {
			_, err = try(x + 1)
		} else if !ok && x-1 > lo {
			_, err = try(x - 1)
		}
		if err != nil {
			return 0, err
		}
	}
	b.limit[k] = lo
	return lo, nil
}

// rdpStepLimit returns the largest T with RDP ε(T·rdp) ≤ target at δ
// (at least 1), by doubling and bisection on the cheap RDP conversion;
// rdp is one step's RDP over DefaultOrders.
func rdpStepLimit(rdp []float64, delta, target float64) int64 {
	orders := DefaultOrders()
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
		if hi >= pldMaxLimit {
			return pldMaxLimit
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

package ledger

import (
	"fmt"
	"math"
	"math/bits"
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
	// It accounts for the (Poisson-subsampled) continuous Gaussian mechanism
	// only: a charge of any other event is refused with ErrInvalidEvent.
	AccountantPLD = "pld"
)

// knownAccountant reports whether a run record may name accountant.
func knownAccountant(accountant string) bool {
	return accountant == AccountantRDP || accountant == AccountantPLD || accountant == ""
}

// AccountantSupports reports whether the accountant can charge runs whose
// noise mechanism is mechanism (see MechanismKind): RDP charges every
// mechanism; PLD only the continuous Gaussian (MechanismFloat and the
// legacy ""), since no bound of the discrete Gaussian's privacy loss
// distribution by the Gaussian's is established here (see docs/PRIVACY.md).
func AccountantSupports(accountant, mechanism string) bool {
	kind, ok := MechanismKind(mechanism)
	if !ok || !knownAccountant(accountant) {
		return false
	}
	return accountant != AccountantPLD || kind == KindGaussian
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
		return &pldBudget{delta: delta, target: target, limit: map[pldKey]int64{}, eps: map[pldKey]map[int64]float64{}}, nil
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

// pldKey names one step mechanism of the PLD budget.
type pldKey struct{ q, sigma float64 }

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
//   - epsilon: for n identical steps it is the PLD ε at the grid count
//     g(n) ≥ n, capped at T* (g keeps the top 3 significant bits of n,
//     rounding up: counts 1..8 exactly, then at most 25% above n), cached
//     per count. PLD ε is non-decreasing in the count (composition never
//     lowers the privacy loss), so ε(g(n)) is an upper bound on ε(n); it
//     costs O(log n) evaluations over a whole run, and it is exact at T*,
//     the last step a run can take. Mixed steps compose all events.
type pldBudget struct {
	delta, target float64
	events        []PLDEvent // in first-charged order, one per (q, σ)
	limit         map[pldKey]int64
	eps           map[pldKey]map[int64]float64
}

// pldStepOf returns the PLD event of one step of e: a Poisson-sampled
// Gaussian (or a plain Gaussian, q = 1). Other mechanisms are refused.
func pldStepOf(e Event) (PLDEvent, error) {
	if err := e.Validate(); err != nil {
		return PLDEvent{}, err
	}
	switch {
	case e.Kind == KindGaussian:
		return PLDEvent{SampleRate: 1, NoiseMultiplier: e.NoiseMultiplier, Count: 1}, nil
	case e.Kind == KindPoissonSampled && e.Event.Kind == KindGaussian:
		return PLDEvent{SampleRate: e.SampleRate, NoiseMultiplier: e.Event.NoiseMultiplier, Count: 1}, nil
	}
	return PLDEvent{}, fmt.Errorf("%w: the PLD accountant charges only the (Poisson-sampled) Gaussian mechanism, not %s", ErrInvalidEvent, describe(e))
}

// with returns the budget's events plus one step of s.
func (b *pldBudget) with(s PLDEvent) []PLDEvent {
	return addPLDStep(slices.Clone(b.events), s)
}

// addPLDStep adds one step of s to evs, in place where evs has its (q, σ).
func addPLDStep(evs []PLDEvent, s PLDEvent) []PLDEvent {
	for i := range evs {
		if evs[i].SampleRate == s.SampleRate && evs[i].NoiseMultiplier == s.NoiseMultiplier {
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
		limit, err := b.stepLimit(pldKey{s.SampleRate, s.NoiseMultiplier})
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
		k := pldKey{ev.SampleRate, ev.NoiseMultiplier}
		g := pldGrid(ev.Count)
		if limit, err := b.stepLimit(k); err != nil {
			return 0, err
		} else if ev.Count <= limit {
			g = min(g, limit)
		}
		return b.at(k, g)
	}
	return PLDEpsilonEvents(b.events, b.delta)
}

// pldGrid rounds n up to its top 3 significant bits.
func pldGrid(n int64) int64 {
	if n <= 8 {
		return n
	}
	shift := bits.Len64(uint64(n)) - 3
	return ((n-1)>>shift + 1) << shift
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
	eps, err := PLDEpsilon(k.q, k.sigma, n, b.delta)
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
// most the target (0 if one step exceeds it), computed once.
func (b *pldBudget) stepLimit(k pldKey) (int64, error) {
	if t, ok := b.limit[k]; ok {
		return t, nil
	}
	ok := func(n int64) (bool, error) {
		eps, err := b.at(k, n)
		return eps <= b.target, err
	}
	// Start from the RDP accountant's step count for the same budget.
	start := int64(1)
	if acc, err := NewAccountant(nil); err == nil {
		if err := acc.Compose(SubsampledGaussian(k.q, k.sigma), 1); err == nil {
			if e1, _, err := acc.Epsilon(b.delta); err == nil && e1 < b.target {
				start = rdpStepLimit(acc.RDP(), b.delta, b.target)
			}
		}
	}
	lo, hi := int64(0), int64(0) // ok(lo) (or lo = 0), !ok(hi) (or hi = 0: unknown)
	if good, err := ok(start); err != nil {
		return 0, err
	} else if good {
		lo = start
		for n := start; hi == 0; {
			if n >= pldMaxLimit {
				b.limit[k] = pldMaxLimit
				return pldMaxLimit, nil
			}
			n = min(n+max(n/4, 1), pldMaxLimit)
			good, err := ok(n)
			if err != nil {
				return 0, err
			}
			if good {
				lo = n
			} else {
				hi = n
			}
		}
	} else {
		hi = start
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		good, err := ok(mid)
		if err != nil {
			return 0, err
		}
		if good {
			lo = mid
		} else {
			hi = mid
		}
	}
	b.limit[k] = lo
	return lo, nil
}

// rdpStepLimit returns the largest T with RDP ε(T·rdp) ≤ target at δ
// (at least 1), by doubling and bisection on the cheap RDP conversion.
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

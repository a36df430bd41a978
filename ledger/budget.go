package ledger

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/dpcluster/dpcluster/accounting"
)

// Accountants a run record can name: the one whose ε the ledger enforces
// and records for the run.
const (
	// AccountantRDP: the Rényi DP accountant over the default orders
	// (accounting.RDP). Run records written before accountants were
	// recorded hold "", which means the same.
	AccountantRDP = string(accounting.NameRDP)
	// AccountantPLD: the privacy-loss-distribution accountant
	// (accounting.PLD). It accounts for the (Poisson-subsampled) continuous
	// Gaussian mechanism, and the discrete Gaussian when its event names its
	// lattice (accounting.DiscreteGaussianLattice): a charge of any other
	// event is refused with accounting.ErrInvalidEvent.
	AccountantPLD = string(accounting.NamePLD)
)

// accountantOf returns the accountant a run record names ("" is RDP).
func accountantOf(accountant string) (accounting.Accountant, error) {
	if accountant == "" {
		accountant = AccountantRDP
	}
	return accounting.New(accounting.Name(accountant))
}

// knownAccountant reports whether a run record may name accountant.
func knownAccountant(accountant string) bool {
	_, err := accountantOf(accountant)
	return err == nil
}

// AccountantSupports reports whether the accountant can charge runs whose
// noise mechanism is mechanism (see MechanismKind): both accountants charge
// both mechanisms; PLD charges the discrete Gaussian's events only when
// they name its lattice (accounting.PLDStep), which runs configured for PLD do.
func AccountantSupports(accountant, mechanism string) bool {
	_, ok := MechanismKind(mechanism)
	return ok && knownAccountant(accountant)
}

// budget is the accountant state of a ledger: the events charged so far,
// composed with the run's accountant. Both implementations are
// deterministic functions of the charged events, in order, so an auditor
// replaying the file gets every recorded ε bit for bit.
type budget interface {
	// check reports whether charging e once more would take ε past
	// target, in two parts: it reads the budget now, and the returned
	// function runs the accountant (the PLD step-limit search, seconds
	// the first time), safely on any goroutine and while the budget goes
	// on changing, answering for the budget as it was (exceeds runs both
	// at once). It changes nothing.
	check(e accounting.Event, target float64) (func() (bool, error), error)
	// add charges e once. Callers check exceeds first.
	add(e accounting.Event) error
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
	acc, err := accountantOf(accountant)
	if err != nil {
		return nil, err
	}
	switch acc := acc.(type) {
	case accounting.RDP:
		return &rdpBudget{acc: acc.NewComposition(), delta: delta}, nil
	case accounting.PLD:
		return &pldBudget{acc: acc, delta: delta, target: target, series: map[pldKey]*pldSeries{}}, nil
	}
	return nil, fmt.Errorf("%w: no budget for the %s accountant", ErrInvalidParameter, acc.Name())
}

// rdpBudget composes with the RDP accountant: O(len(orders)) per check.
type rdpBudget struct {
	acc   *accounting.RDPComposition
	delta float64
}

func (b *rdpBudget) check(e accounting.Event, target float64) (func() (bool, error), error) {
	after, delta := b.acc.Clone(), b.delta
	return func() (bool, error) {
		if err := after.Compose(e, 1); err != nil {
			return false, err
		}
		eps, _, err := after.Epsilon(delta)
		if err != nil {
			return false, err
		}
		return eps > target, nil
	}, nil
}

// exceeds runs both parts of b.check at once.
func exceeds(b budget, e accounting.Event, target float64) (bool, error) {
	f, err := b.check(e, target)
	if err != nil {
		return false, err
	}
	return f()
}

func (b *rdpBudget) clone() budget {
	return &rdpBudget{acc: b.acc.Clone(), delta: b.delta}
}

func (b *rdpBudget) add(e accounting.Event) error { return b.acc.Compose(e, 1) }

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

func keyOf(e accounting.PLDEvent) pldKey {
	return pldKey{e.SampleRate, e.NoiseMultiplier, e.Dimension, e.LatticeScale}
}

// event returns n steps of k.
func (k pldKey) event(n int64) accounting.PLDEvent {
	return accounting.PLDEvent{SampleRate: k.q, NoiseMultiplier: k.sigma, Count: n, Dimension: k.dim, LatticeScale: k.scale}
}

// PLDGridRatio bounds how far above the PLD accountant's own ε of the
// steps taken a PLD ledger's recorded ε may be: for a run of identical
// steps, the ε recorded after n steps is the accountant's ε at the
// smallest count of the run's count grid that is ≥ n, and consecutive
// grid counts differ in ε by at most this factor (see pldSeries).
const PLDGridRatio = 1.008

// pldBudget composes with the PLD accountant. One PLD evaluation costs two
// FFT compositions (about 25 ms on one core for runs of up to ~10³ steps,
// more for longer ones: accounting/pld.go), so for the common case, a run of
// identical steps, nothing is evaluated per step: each step mechanism
// (pldKey) has a pldSeries that evaluates the accountant at a sparse grid
// of counts, once, and
//
//   - exceeds is n + 1 > T*, O(1), T* the largest count whose PLD ε is
//     within the target;
//   - epsilon after n steps is ε(G(n)), G(n) the smallest grid count ≥ n:
//     never below the exact ε of the n steps (the exact ε is
//     non-decreasing in the count: composing one more mechanism never
//     lowers the privacy loss, and the accountant's ε(G(n)) bounds the
//     exact ε(G(n)) from above), and at most PLDGridRatio above the
//     accountant's ε(n). T* is a grid count, so a run that ends at its
//     step limit records the accountant's ε of exactly its steps.
//
// Steps with different (q, σ) fall back to composing them all
// (accounting.PLD.EpsilonSteps) on every call.
type pldBudget struct {
	acc           accounting.PLD
	delta, target float64
	events        []accounting.PLDEvent // in first-charged order, one per (q, σ)
	// series holds one pldSeries per step mechanism. Clones share it: a
	// series holds values determined by its key, δ and target alone.
	// The map itself is touched only by the budget's owner.
	series map[pldKey]*pldSeries
	// planned, if positive, is the run's planned step count (PlanSteps):
	// the step-limit search's first guess. σ is calibrated for exactly
	// that many steps, so T* is planned or just above it, and the search
	// closes its bracket in two evaluations.
	planned int64
}

// with returns the budget's events plus one step of s.
func (b *pldBudget) with(s accounting.PLDEvent) []accounting.PLDEvent {
	return addPLDStep(slices.Clone(b.events), s)
}

// addPLDStep adds one step of s to evs, in place where evs has its (q, σ).
func addPLDStep(evs []accounting.PLDEvent, s accounting.PLDEvent) []accounting.PLDEvent {
	for i := range evs {
		if keyOf(evs[i]) == keyOf(s) {
			evs[i].Count++
			return evs
		}
	}
	return append(evs, s)
}

// seriesOf returns k's series, creating it on first use.
func (b *pldBudget) seriesOf(k pldKey) *pldSeries {
	s := b.series[k]
	if s == nil {
		s = &pldSeries{acc: b.acc, key: k, delta: b.delta, target: b.target, planned: b.planned,
			evals: map[int64]float64{}, limit: -1}
		b.series[k] = s
	}
	return s
}

// check reads the events and the series now (seriesOf may add to the
// series map); the returned function only reads its own copy of the
// events and goes through the series' own lock.
func (b *pldBudget) check(e accounting.Event, target float64) (func() (bool, error), error) {
	s, err := accounting.PLDStep(e)
	if err != nil {
		return nil, err
	}
	evs := b.with(s)
	if len(evs) == 1 && target == b.target {
		series, count := b.seriesOf(keyOf(s)), evs[0].Count
		return func() (bool, error) {
			limit, err := series.stepLimit()
			if err != nil {
				return false, err
			}
			return count > limit, nil
		}, nil
	}
	acc, delta := b.acc, b.delta
	return func() (bool, error) {
		eps, err := acc.EpsilonSteps(evs, delta)
		if err != nil {
			return false, err
		}
		return eps > target, nil
	}, nil
}

func (b *pldBudget) clone() budget {
	c := *b
	c.events = slices.Clone(b.events)
	return &c
}

func (b *pldBudget) add(e accounting.Event) error {
	s, err := accounting.PLDStep(e)
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
		return b.seriesOf(keyOf(ev)).epsilon(ev.Count)
	}
	return b.acc.EpsilonSteps(b.events, b.delta)
}

// warm returns a function that extends the series of the budget's steps
// so that it covers one step more than charged, one grid count at a time
// until stop reports true, or nil when there is nothing to do (the grid
// covers it already, or the steps are mixed). The function may run on
// another goroutine: a series locks itself.
func (b *pldBudget) warm() func(stop func() bool) {
	if len(b.events) != 1 {
		return nil
	}
	ev := b.events[0]
	s := b.seriesOf(keyOf(ev))
	next := ev.Count + 1
	if s.covers(next) {
		return nil
	}
	return func(stop func() bool) {
		for !stop() && !s.covers(next) {
			if s.extendOnce() != nil {
				return // the charge that needs it reports the error
			}
		}
	}
}

// prewarm returns a function that computes, on several goroutines at
// once, the step limit and the dense start of the grid for runs of e
// (pldSeries.prewarm), or nil if the PLD budget cannot charge e.
func (b *pldBudget) prewarm(e accounting.Event) func(stop func() bool) {
	st, err := accounting.PLDStep(e)
	if err != nil {
		return nil
	}
	s := b.seriesOf(keyOf(st))
	return func(stop func() bool) { s.prewarm(runtime.GOMAXPROCS(0), stop) }
}

// pldSeries is the PLD accountant's ε for runs of identical steps of one
// mechanism (key) at one δ, with the step limit for one target: every
// value it holds is a deterministic function of (key, δ, target), so an
// auditor replaying a ledger computes the same values in the same order,
// bit for bit. It is safe for concurrent use (a ledger warms the next
// grid count on a goroutine of its own).
//
// # The count grid
//
// The grid is built in order, from counts[0] = 1: from the last grid
// count g with ε(g) = e, the next is g + s, s ≥ 1 a guess from the local
// slope of log ε over log count (ε grows roughly like a power of the
// count) aimed at ε(g + s) = e·PLDGridRatio^0.9, capped so that the step
// limit T* and every power of two are grid counts, and halved until ε(g + s) ≤
// PLDGridRatio·e (s = 1 is always taken: there are no counts between).
// So for g_k < n ≤ g_{k+1}: ε(g_{k+1}) ≤ PLDGridRatio·ε(g_k) ≤
// PLDGridRatio·ε(n), the last step because the accountant's ε is
// non-decreasing in the count: the exact ε by composition, and the
// computed one too within a power-of-two bucket, whose counts share one
// discretized step PLD (pldPrepare), up to FFT round-off. Its
// discretization error is below 5e-4 relative (accounting/pld.go,
// TestPLDDiscretizationError), so the recorded ε is within 0.85% of the
// exact. On the README's main job (q = 256/60000, σ ≈ 0.643, 1000 steps)
// that is about 150 grid counts, one PLD evaluation each (about 10 ms of
// one core: 1.5 s over the run), done off the state machine's path
// (Ledger.warm).
type pldSeries struct {
	mu            sync.Mutex
	acc           accounting.PLD
	key           pldKey
	delta, target float64
	planned       int64
	evals         map[int64]float64 // the accountant's ε at the counts evaluated
	limit         int64             // T*, −1 until computed
	counts        []int64           // the grid, increasing
	eps           []float64         // ε at each grid count
}

// covers reports whether the grid already reaches count n.
func (s *pldSeries) covers(n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.counts) > 0 && s.counts[len(s.counts)-1] >= n
}

// pldPrewarmMax bounds the counts prewarm evaluates ahead of the charges.
const pldPrewarmMax = 256

// prewarm computes the step limit and the grid's dense start, where every
// count is a grid count (ε grows by more than PLDGridRatio a step: the
// first 90 steps of the main job), evaluating the accountant at the next
// counts on workers goroutines at once and then extending the grid from
// the remembered values, until the grid leaves its dense start, reaches
// the step limit or pldPrewarmMax, or stop reports true. The values are
// the ones the grid would compute one at a time (EpsilonSteps is a
// function of its inputs): only when the work is done changes.
func (s *pldSeries) prewarm(workers int, stop func() bool) {
	if s.extendOnce() != nil { // the step limit and count 1
		return
	}
	for !stop() {
		s.mu.Lock()
		m := len(s.counts)
		last := s.counts[m-1]
		dense := m < 2 || last-s.counts[m-2] == 1
		var todo []int64
		for c := last + 1; c <= min(last+int64(2*workers), s.limit, pldPrewarmMax); c++ {
			if _, ok := s.evals[c]; !ok {
				todo = append(todo, c)
			}
		}
		s.mu.Unlock()
		if !dense || len(todo) == 0 {
			return
		}
		var wg sync.WaitGroup
		for w := range min(workers, len(todo)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < len(todo); i += workers {
					eps, err := s.acc.EpsilonSteps([]accounting.PLDEvent{s.key.event(todo[i])}, s.delta)
					if err != nil {
						return // the charge that needs it reports the error
					}
					s.mu.Lock()
					s.evals[todo[i]] = eps
					s.mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for !stop() && !s.covers(todo[len(todo)-1]) {
			if s.extendOnce() != nil {
				return
			}
		}
	}
}

// extendOnce computes the step limit if needed and appends one grid count.
func (s *pldSeries) extendOnce() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.stepLimitLocked(); err != nil {
		return err
	}
	return s.extend()
}

// epsilon returns the recorded ε of n ≥ 1 steps: ε(G(n)).
func (s *pldSeries) epsilon(n int64) (float64, error) {
	if n < 1 {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.stepLimitLocked(); err != nil {
		return 0, err
	}
	for len(s.counts) == 0 || s.counts[len(s.counts)-1] < n {
		if err := s.extend(); err != nil {
			return 0, err
		}
	}
	i, _ := slices.BinarySearch(s.counts, n)
	return s.eps[i], nil
}

// extend appends the next grid count (see the type's comment). Callers
// hold s.mu and have computed the step limit.
func (s *pldSeries) extend() error {
	m := len(s.counts)
	if m == 0 {
		e, err := s.at(1)
		if err != nil {
			return err
		}
		s.counts, s.eps = append(s.counts, 1), append(s.eps, e)
		return nil
	}
	last, e := s.counts[m-1], s.eps[m-1]
	step := int64(1)
	if m >= 2 {
		p, ep := s.counts[m-2], s.eps[m-2]
		if a := math.Log(e/ep) / math.Log(float64(last)/float64(p)); a > 0 && !math.IsInf(a, 0) {
			if f := float64(last) * (math.Pow(PLDGridRatio, 0.9/a) - 1); f > 1 {
				step = int64(math.Min(f, float64(last))) // at most double
			}
		}
	}
	step = min(step, accounting.MaxStepLimit-last)
	if step < 1 {
		return fmt.Errorf("%w: more than %d steps", ErrInvalidParameter, accounting.MaxStepLimit)
	}
	// The next power of two above last: the accountant places its window
	// per power-of-two bucket of counts (pldShape), so a grid count in
	// the same bucket as every count it stands for shares its
	// discretization, and ε(G(n)) ≥ ε(n) holds for the computed values
	// too, not only for the exact ones.
	pow := int64(1)
	for pow <= last {
		pow <<= 1
	}
	for {
		c := last + step
		for _, lim := range []int64{s.limit, pow} {
			if last < lim && c > lim {
				c = lim
			}
		}
		step = c - last
		ec, err := s.at(c)
		if err != nil {
			return err
		}
		if step == 1 || ec <= PLDGridRatio*e {
			s.counts, s.eps = append(s.counts, c), append(s.eps, ec)
			return nil
		}
		step = max(step/2, 1)
	}
}

// at returns the accountant's ε of n steps, remembered. Callers hold s.mu.
func (s *pldSeries) at(n int64) (float64, error) {
	if eps, ok := s.evals[n]; ok {
		return eps, nil
	}
	eps, err := s.acc.EpsilonSteps([]accounting.PLDEvent{s.key.event(n)}, s.delta)
	if err != nil {
		return 0, err
	}
	s.evals[n] = eps
	return eps, nil
}

// stepLimit returns T*, the largest count of steps whose PLD ε is at most
// the target (0 if one step exceeds it), computed once.
func (s *pldSeries) stepLimit() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stepLimitLocked()
}

// stepLimitLocked is stepLimit for callers holding s.mu: the PLD
// accountant's step limit (accounting.PLD.StepLimit), starting at the
// run's planned step count if it was given (PlanSteps).
func (s *pldSeries) stepLimitLocked() (int64, error) {
	if s.limit >= 0 {
		return s.limit, nil
	}
	limit, err := s.acc.StepLimit(s.key.event(1).Event(), s.target, s.delta, s.planned)
	if err != nil {
		return 0, err
	}
	s.limit = limit
	return limit, nil
}

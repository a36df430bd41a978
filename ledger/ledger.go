package ledger

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// ErrInvalidParameter is returned by Start, NewReplay and the dataset
// budget for a target ε, δ, noise source, mechanism, accountant or count
// outside its valid range. Errors of the accounting itself (an event the
// run's accountant cannot charge, an accountant that fails) wrap the
// accounting package's sentinels instead.
var ErrInvalidParameter = errors.New("ledger: invalid accounting parameter")

// ErrBudgetExceeded is returned by Charge when the charge would push ε past
// the run's target. Nothing is recorded; the run must stop.
var ErrBudgetExceeded = errors.New("ledger: privacy budget exceeded")

// ErrRunMismatch is returned by Start when the ledger already belongs to a
// run with other parameters.
var ErrRunMismatch = errors.New("ledger: ledger belongs to a different run")

// ErrOutOfOrder is returned by Charge for a position whose Raft index is
// not above the last charge's: that entry is charged already (Charged says
// so), or the caller is charging out of log order. Nothing is recorded.
var ErrOutOfOrder = errors.New("ledger: charge out of Raft log order")

// ErrHistoryMismatch is returned (wrapped, with what each side holds) when
// a ledger is asked to account for a Raft history other than the one its
// run record binds it to (Start, Charge, Charged, CheckHistory), or when a
// replica's Raft state no longer holds every entry the ledger charged
// (CheckRaftState). Nothing is recorded. A replica that gets it must not
// go on: its Raft log would re-use indexes the ledger has charged for
// other releases, and those releases would go uncharged.
var ErrHistoryMismatch = errors.New("ledger: ledger and Raft state belong to different histories")

// ErrRunEnded is returned by Charge for a charge of an applied step
// (replay false) after the ledger recorded the run's end, and by End for an
// end other than the one recorded. Nothing is recorded. An ended run
// applies no more steps; a release committed after its end is still
// charged, as a replay.
var ErrRunEnded = errors.New("ledger: the run has ended")

// Ledger is the durable privacy ledger of one coordinator replica: a File of
// records and the accountant state those records imply. Charges are
// accounted with the accountant the run record names (AccountantRDP over
// the default orders, or AccountantPLD; "" in ledgers from before the
// field means RDP; package accounting), one charge per record in file order, so an auditor who
// replays the file gets the same ε bit for bit.
//
// Ledger is not safe for concurrent use; the coordinator's state machine
// owns it.
type Ledger struct {
	file      *File
	budget    budget  // the run's accountant state, nil before Start
	run       *Record // the run record, nil before Start
	lastIndex uint64  // Raft index of the last charge
	lastStep  int64   // highest step charged
	charges   uint64
	spent     float64 // the ε the last charge record holds (0 before any)
	end       *Record // the end record, nil while the run runs

	// warming is the goroutine, if any, that computes ahead what the
	// next charge's ε needs (warm); Close sets closing and waits for it.
	warming sync.WaitGroup
	busy    atomic.Bool
	closing atomic.Bool
}

// Open opens (or creates) the ledger file at path, repairing a torn tail
// (see OpenFile), and replays its records into a fresh accountant.
func Open(path string, opts ...Option) (*Ledger, error) {
	var l *Ledger
	f, err := openAndReplay(path, opts, func(recs []Record) (err error) {
		l, err = replay(recs)
		return err
	})
	if err != nil {
		return nil, err
	}
	l.file = f
	l.warm() // a resumed run's next charge needs the grid up to here
	return l, nil
}

// replay rebuilds ledger state from verified records.
func replay(recs []Record) (*Ledger, error) {
	l := &Ledger{}
	for _, r := range recs {
		if err := l.replayRecord(r); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// replayRecord adds one verified record, the next in file order, to the
// ledger's in-memory state.
func (l *Ledger) replayRecord(r Record) error {
	switch r.Kind {
	case RecordRun:
		if l.run != nil {
			return fmt.Errorf("%w: second run record at seq %d", ErrCorrupt, r.Seq)
		}
		b, err := newBudget(r.Accountant, r.Delta, r.TargetEpsilon)
		if err != nil {
			return fmt.Errorf("%w: run record: %v", ErrCorrupt, err)
		}
		l.run, l.budget = &r, b
	case RecordCharge:
		if l.run == nil {
			return fmt.Errorf("%w: charge at seq %d before the run record", ErrCorrupt, r.Seq)
		}
		if r.History != l.run.History {
			return fmt.Errorf("%w: charge at seq %d is from Raft history %s, the run record's is %s",
				ErrCorrupt, r.Seq, historyName(r.History), historyName(l.run.History))
		}
		if l.end != nil && !r.Replay {
			return fmt.Errorf("%w: charge of step %d at seq %d after the run ended", ErrCorrupt, r.Step, r.Seq)
		}
		if err := l.budget.add(*r.Event); err != nil {
			return fmt.Errorf("%w: seq %d: %v", ErrCorrupt, r.Seq, err)
		}
		l.lastIndex = max(l.lastIndex, r.Index)
		l.lastStep = max(l.lastStep, r.Step)
		l.charges++
		l.spent = r.Epsilon
	case RecordEnd:
		switch {
		case l.run == nil:
			return fmt.Errorf("%w: end at seq %d before the run record", ErrCorrupt, r.Seq)
		case l.end != nil:
			return fmt.Errorf("%w: second end record at seq %d", ErrCorrupt, r.Seq)
		case r.History != l.run.History:
			return fmt.Errorf("%w: end at seq %d is from Raft history %s, the run record's is %s",
				ErrCorrupt, r.Seq, historyName(r.History), historyName(l.run.History))
		}
		l.end = &r
	default:
		return fmt.Errorf("%w: a %q record at seq %d in a run's ledger", ErrCorrupt, r.Kind, r.Seq)
	}
	return nil
}

// Extend appends tail, the records that follow this ledger's last one in
// another replica's byte-identical ledger (a snapshot's, whose first
// Size() bytes are this file), and replays them, so that a replica
// installing a snapshot does work in proportion to the charges it lacks.
// Replacing the file instead (Install, then Open) verifies, writes and
// replays every record of the run: 0.45 s at 8000 charges on an idle
// 2-core machine, 1.5 s under load, long enough for a restarted replica
// to fall behind again while it installs. Every record of tail is verified
// as Open verifies a file's and replayed as Open replays it before
// anything is written (a refusal, ErrCorrupt, changes nothing); then tail
// is written with one fsync (a failure breaks the ledger, as in Charge).
func (l *Ledger) Extend(tail []byte) error {
	var next *Ledger
	_, err := l.file.appendFrames(tail, func(recs []Record) error {
		next = &Ledger{run: l.run, end: l.end, lastIndex: l.lastIndex, lastStep: l.lastStep, charges: l.charges, spent: l.spent}
		if l.budget != nil {
			next.budget = l.budget.clone()
		}
		for _, r := range recs {
			if err := next.replayRecord(r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || next == nil {
		return err
	}
	l.run, l.end, l.budget, l.lastIndex, l.lastStep = next.run, next.end, next.budget, next.lastIndex, next.lastStep
	l.charges, l.spent = next.charges, next.spent
	l.warm()
	return nil
}

// Position locates a release in the replicated log: the Raft history it
// belongs to and the entry's term and index.
//
// A Raft history is one Raft log from its first entry on. Its History ID is
// a random string the coordinator draws when the run configuration is first
// proposed and carries in that configuration entry, so every replica sees
// the same one; a log rebuilt from nothing (a wiped data dir) starts a new
// history with a new ID, even though its indexes start again from 1. Raft
// indexes identify entries only within one history, so the ledger compares
// indexes only there.
type Position struct {
	History string
	Term    uint64
	Index   uint64
}

// Noise mechanisms a run record can name.
const (
	// MechanismDiscrete: the sum snapped to a grid plus exactly sampled
	// discrete Gaussian noise (package mechanism); charged as
	// KindDiscreteGaussian.
	MechanismDiscrete = "discrete"
	// MechanismFloat: floating-point Gaussian noise, charged as
	// KindGaussian. It is not protected against floating-point attacks
	// (Mironov 2012). Run records written before mechanisms were recorded
	// hold "", which means the same.
	MechanismFloat = "float"
)

// MechanismKind returns the event kind a run with the given mechanism
// charges for its noise: KindDiscreteGaussian for MechanismDiscrete,
// KindGaussian for MechanismFloat and "" (a run record from before the
// field), and false for an unknown mechanism.
func MechanismKind(mechanism string) (accounting.Kind, bool) {
	switch mechanism {
	case MechanismDiscrete:
		return accounting.KindDiscreteGaussian, true
	case MechanismFloat, "":
		return accounting.KindGaussian, true
	}
	return "", false
}

// Start records the run's identity, budget, noise source (seed.Crypto or
// seed.Seeded), noise mechanism (MechanismDiscrete, MechanismFloat, or ""
// for a run configured before mechanisms were recorded), accountant
// (AccountantPLD, AccountantRDP, or "" for a run configured before
// accountants were recorded, which means RDP; PLD only for a mechanism it
// supports, AccountantSupports) and Raft history as
// the ledger's first record, binding the ledger to that history. If the
// ledger already holds a run record, Start checks that it matches
// (ErrRunMismatch for other run parameters, ErrHistoryMismatch for another
// history) and records nothing.
func (l *Ledger) Start(run string, targetEps, delta float64, noise seed.Policy, mechanism, accountant, history string) error {
	return l.StartRun(RunParams{Run: run, TargetEpsilon: targetEps, Delta: delta, Noise: noise, Mechanism: mechanism,
		Accountant: accountant, History: history})
}

// RunParams is what a run record states: Start's arguments, and the
// dataset budget admission of a run admitted to one (nil otherwise).
type RunParams struct {
	Run                  string
	TargetEpsilon, Delta float64
	Noise                seed.Policy
	Mechanism            string
	Accountant           string
	History              string
	Admission            *Admission
}

// StartRun is Start with the run's dataset budget admission, if any,
// recorded in the run record beside the rest (Record.DatasetAdmission
// reads it back); a ledger that holds a run record must hold the same
// admission, or StartRun returns ErrRunMismatch.
func (l *Ledger) StartRun(p RunParams) error {
	run, targetEps, delta, noise, mechanism, accountant, history := p.Run, p.TargetEpsilon, p.Delta, p.Noise, p.Mechanism, p.Accountant, p.History
	if err := noise.Validate(); err != nil {
		return fmt.Errorf("%w: noise source: %w", ErrInvalidParameter, err)
	}
	if _, ok := MechanismKind(mechanism); !ok {
		return fmt.Errorf("%w: noise mechanism %q", ErrInvalidParameter, mechanism)
	}
	if !knownAccountant(accountant) {
		return fmt.Errorf("%w: accountant %q must be %q or %q", ErrInvalidParameter, accountant, AccountantPLD, AccountantRDP)
	}
	if !AccountantSupports(accountant, mechanism) {
		return fmt.Errorf("%w: the %s accountant cannot charge noise mechanism %q", ErrInvalidParameter, accountant, mechanism)
	}
	if !(targetEps > 0) || math.IsInf(targetEps, 0) {
		return fmt.Errorf("%w: target epsilon %v", ErrInvalidParameter, targetEps)
	}
	if !(delta > 0 && delta < 1) {
		return fmt.Errorf("%w: delta %v", ErrInvalidParameter, delta)
	}
	if l.run != nil {
		if l.run.Run != run || l.run.TargetEpsilon != targetEps || l.run.Delta != delta || l.run.Noise != noise || l.run.Mechanism != mechanism ||
			l.run.Accountant != accountant {
			return fmt.Errorf("%w: ledger has run %q (ε=%v, δ=%v, noise %q, mechanism %q, accountant %q), asked for %q (ε=%v, δ=%v, noise %q, mechanism %q, accountant %q)",
				ErrRunMismatch, l.run.Run, l.run.TargetEpsilon, l.run.Delta, l.run.Noise, l.run.Mechanism, l.run.Accountant,
				run, targetEps, delta, noise, mechanism, accountant)
		}
		if had, ok := l.run.DatasetAdmission(); ok != (p.Admission != nil) || ok && had != *p.Admission {
			return fmt.Errorf("%w: ledger has run %q with dataset budget admission %s, asked for %s",
				ErrRunMismatch, l.run.Run, admissionName(l.run.DatasetAdmission()), admissionName(deref(p.Admission)))
		}
		return l.CheckHistory(history)
	}
	if p.Admission != nil {
		if err := p.Admission.Validate(); err != nil {
			return err
		}
	}
	b, err := newBudget(accountant, delta, targetEps)
	if err != nil {
		return err
	}
	rec := Record{Kind: RecordRun, Run: run, TargetEpsilon: targetEps, Delta: delta, Noise: noise,
		Mechanism: mechanism, Accountant: accountant, History: history}
	if a := p.Admission; a != nil {
		rec.Dataset, rec.BudgetID, rec.AdmissionID, rec.BudgetFile = a.Dataset, a.Budget, a.ID, a.File
		rec.BudgetEpsilon, rec.BudgetDelta = a.Epsilon, a.Delta
	}
	r, err := l.file.Append(rec)
	if err != nil {
		return err
	}
	l.run, l.budget = &r, b
	return nil
}

// CheckHistory returns nil if the ledger may account for releases of the
// Raft history history: it has no run record yet, or its run record names
// that history. Otherwise it returns an error wrapping ErrHistoryMismatch
// that says what the ledger holds. This is the one rule binding a ledger
// to a history; Start, Charge, Charged and CheckRaftState apply it.
func (l *Ledger) CheckHistory(history string) error {
	if l.run == nil || l.run.History == history {
		return nil
	}
	return fmt.Errorf("%w: %s; asked to account for Raft history %s", ErrHistoryMismatch, l.describe(), historyName(history))
}

// describe says what the ledger holds, for error messages.
func (l *Ledger) describe() string {
	return fmt.Sprintf("ledger %s holds run %q of Raft history %s with %d charges up to Raft index %d",
		l.file.Path(), l.run.Run, historyName(l.run.History), l.charges, l.lastIndex)
}

// historyName is how messages show a history ID.
func historyName(h string) string {
	if h == "" {
		return "(none recorded)"
	}
	return h
}

// RaftState is what a replica's Raft state on disk (log and snapshots)
// says, read before Raft starts: whether it holds the run configuration
// and the history ID that configuration carries, and the index of the last
// entry it holds (the log's last index or the latest snapshot's, whichever
// is higher; 0 when there is no Raft state at all).
type RaftState struct {
	Configured bool
	History    string
	LastIndex  uint64
}

// CheckRaftState returns nil if a replica whose Raft state is s may resume
// this ledger, and an error wrapping ErrHistoryMismatch otherwise. The
// ledger deduplicates charges by Raft index (Charged), which is sound only
// if the Raft state still holds every entry the ledger charged, so that an
// index at or below LastIndex can only be one of those entries replayed.
// So a ledger with a run record requires a Raft state that
//
//   - holds the run configuration (an empty or configuration-less Raft
//     state next to a non-empty ledger means the log and snapshots were
//     lost or deleted: the new history would reuse charged indexes),
//   - of the ledger's history (CheckHistory), and
//   - reaches the ledger's last charged index (a shorter log lost
//     entries, and the steps proposed again at those indexes would be
//     taken for replays).
//
// An empty ledger (no run record) accepts any Raft state.
func (l *Ledger) CheckRaftState(s RaftState) error {
	switch {
	case l.run == nil:
		return nil
	case !s.Configured && s.LastIndex == 0:
		return fmt.Errorf("%w: %s, but the Raft state is empty: the Raft log and snapshots were lost or deleted",
			ErrHistoryMismatch, l.describe())
	case !s.Configured:
		return fmt.Errorf("%w: %s, but the Raft state (up to index %d) holds no run configuration: Raft log entries or snapshots were lost or deleted",
			ErrHistoryMismatch, l.describe(), s.LastIndex)
	case s.LastIndex < l.lastIndex:
		if err := l.CheckHistory(s.History); err != nil {
			return err
		}
		return fmt.Errorf("%w: %s, but the Raft state ends at index %d: Raft log entries were lost, and steps proposed again at the charged indexes would go uncharged",
			ErrHistoryMismatch, l.describe(), s.LastIndex)
	}
	return l.CheckHistory(s.History)
}

// Charged reports whether the release at pos has already been charged:
// true exactly when pos is in the ledger's history (else an error wrapping
// ErrHistoryMismatch, never true) and pos.Index is at or below LastIndex.
// Charges are appended in log order, so such an entry is one Raft replays
// after a restart, and the state machine must not charge it twice. This is
// the ledger's only deduplication rule; it is sound because a replica
// starts only on a Raft state that passes CheckRaftState.
func (l *Ledger) Charged(pos Position) (bool, error) {
	if l.run == nil {
		return false, errors.New("ledger: Charged before Start")
	}
	if err := l.CheckHistory(pos.History); err != nil {
		return false, err
	}
	return pos.Index <= l.lastIndex, nil
}

// Charge durably records one release of event e for a training step,
// carried by the Raft entry at pos. replay marks a release for a step
// already applied. It returns ErrHistoryMismatch if pos is in another
// history than the ledger's, ErrOutOfOrder if pos.Index is not above
// LastIndex (ask Charged first), ErrBudgetExceeded if the charge would take ε past
// the target, and an error wrapping ErrBroken if the record could not be
// made durable; in every case it records nothing. Only when Charge returns
// nil may the caller apply the step's update.
func (l *Ledger) Charge(step int64, e accounting.Event, pos Position, replay bool) (Record, error) {
	if l.run == nil {
		return Record{}, errors.New("ledger: Charge before Start")
	}
	if err := l.CheckHistory(pos.History); err != nil {
		return Record{}, err
	}
	if pos.Index <= l.lastIndex {
		return Record{}, fmt.Errorf("%w: Raft index %d does not follow the last charge's index %d", ErrOutOfOrder, pos.Index, l.lastIndex)
	}
	if err := e.Validate(); err != nil {
		return Record{}, err
	}
	// Check first: a refused charge leaves the state untouched.
	exceed, err := exceeds(l.budget, e, l.run.TargetEpsilon)
	if err != nil {
		return Record{}, err
	}
	if exceed {
		return Record{}, fmt.Errorf("%w: step %d would spend more than the target ε=%.6g (%s accountant)", ErrBudgetExceeded, step, l.run.TargetEpsilon, l.Accountant())
	}
	// After the budget check: Raft replaying the charge entry the budget
	// refused, which ended the run, gets the same refusal.
	if l.end != nil && !replay {
		return Record{}, fmt.Errorf("%w: step %d charged as applied after the end at step %d (%s)", ErrRunEnded, step, l.end.Step, l.end.Reason)
	}
	next, err := l.after(e)
	if err != nil {
		return Record{}, err
	}
	eps, err := next.epsilon()
	if err == nil && eps > l.run.TargetEpsilon {
		err = fmt.Errorf("%w: step %d would spend ε=%.6g > target %.6g", ErrBudgetExceeded, step, eps, l.run.TargetEpsilon)
	}
	if err != nil {
		return Record{}, err
	}
	r, err := l.file.Append(Record{
		Kind: RecordCharge, Step: step, Event: &e, History: pos.History, Term: pos.Term, Index: pos.Index,
		Replay: replay, Epsilon: eps,
	})
	if err != nil {
		return Record{}, err
	}
	l.budget = next
	l.lastIndex = max(l.lastIndex, pos.Index)
	l.lastStep = max(l.lastStep, step)
	l.charges++
	l.spent = eps
	l.warm()
	return r, nil
}

// End durably records the end of the run: why (reason, non-empty), the
// last step applied (step) and the Raft position of the entry that ended
// it, at or after the last charge's (the same entry for a step entry that
// reached the last step). After it, Charge takes replay charges only
// (ErrRunEnded): the run applies no more steps. Ending a run that already
// ended at the same position, step and reason records nothing and returns
// the recorded end (Raft replaying that entry after a restart); any other
// end returns ErrRunEnded. It returns ErrHistoryMismatch for a position
// of another history, ErrOutOfOrder for one before the last charge, and
// an error wrapping ErrBroken if the record could not be made durable.
func (l *Ledger) End(step int64, reason string, pos Position) (Record, error) {
	if l.run == nil {
		return Record{}, errors.New("ledger: End before Start")
	}
	if err := l.CheckHistory(pos.History); err != nil {
		return Record{}, err
	}
	if e := l.end; e != nil {
		if e.Index == pos.Index && e.Term == pos.Term && e.Step == step && e.Reason == reason {
			return *e, nil
		}
		return Record{}, fmt.Errorf("%w: at step %d (%s), Raft index %d; asked to end at step %d (%s), Raft index %d",
			ErrRunEnded, e.Step, e.Reason, e.Index, step, reason, pos.Index)
	}
	if pos.Index < l.lastIndex {
		return Record{}, fmt.Errorf("%w: end at Raft index %d before the last charge's index %d", ErrOutOfOrder, pos.Index, l.lastIndex)
	}
	r, err := l.file.Append(Record{Kind: RecordEnd, Step: step, Reason: reason, History: pos.History, Term: pos.Term, Index: pos.Index})
	if err != nil {
		return Record{}, err
	}
	l.end = &r
	return r, nil
}

// Ended returns the end record, or false while the run runs.
func (l *Ledger) Ended() (Record, bool) {
	if l.end == nil {
		return Record{}, false
	}
	return *l.end, true
}

// Prewarm starts computing, on goroutines of the ledger's, what charging
// runs of e will need first: the PLD budget's step limit and the dense
// start of its count grid (every count, while ε grows by more than
// PLDGridRatio a step), using every core at once, so that the first
// charges find their ε ready instead of each evaluating the accountant
// on the state machine's path. It changes no result. A no-op for RDP
// runs, before Start, or while warming is already running; Close stops
// and waits for it. The state machine calls it when the run is
// configured (after PlanSteps).
func (l *Ledger) Prewarm(e accounting.Event) {
	b, ok := l.budget.(*pldBudget)
	if !ok {
		return
	}
	l.launch(b.prewarm(e))
}

// launch runs work on the ledger's warming goroutine, unless work is nil
// or that goroutine is busy.
func (l *Ledger) launch(work func(stop func() bool)) {
	if work == nil || !l.busy.CompareAndSwap(false, true) {
		return
	}
	l.warming.Add(1)
	go func() {
		defer l.warming.Done()
		defer l.busy.Store(false)
		work(l.closing.Load)
	}()
}

// warm starts computing, on a goroutine of the ledger's, what the ε of
// one more charge of the same event needs (the PLD budget's next grid
// count: pldBudget.warm), unless that is known or a computation is
// already running. It changes no result, only when the work is done: the
// next Charge finds the value ready instead of computing it on the state
// machine's path. Close stops it after its current grid count (one PLD
// evaluation) and waits for it.
func (l *Ledger) warm() {
	b, ok := l.budget.(*pldBudget)
	if !ok {
		return
	}
	l.launch(b.warm())
}

// WouldExceed reports whether charging e now would take ε past the target,
// without recording anything. The leader uses it to stop before proposing a
// step that the state machine would refuse.
func (l *Ledger) WouldExceed(e accounting.Event) (bool, error) {
	check, err := l.ExceedsCheck(e)
	if err != nil {
		return false, err
	}
	return check()
}

// ExceedsCheck is WouldExceed in two parts, so that a caller can hold its
// own lock only for the first: it reads the ledger now, and the returned
// function runs the accountant (the PLD step-limit search takes seconds
// the first time) on any goroutine, while charges go on, and answers what
// WouldExceed(e) would have answered now. Like WouldExceed it changes
// nothing.
func (l *Ledger) ExceedsCheck(e accounting.Event) (func() (bool, error), error) {
	if l.run == nil {
		return nil, errors.New("ledger: WouldExceed before Start")
	}
	return l.budget.check(e, l.run.TargetEpsilon)
}

// Spent returns ε spent so far at the run's δ by the run's accountant: the
// ε the last charge record holds, 0 before the first charge. It computes
// nothing: every report of ε (status, metrics, logs, export) reads this
// one number, and it is exactly what the ledger file records, which the
// audit recomputes (Audit). A charge whose ε the accountant cannot compute
// is refused (Charge), so this is never less than what was charged.
func (l *Ledger) Spent() float64 {
	if l.run == nil || l.charges == 0 {
		return 0
	}
	return l.spent
}

// PlanSteps tells the ledger how many steps the run plans (its max
// steps), where the PLD accountant enforces the budget: the one-time
// search for the largest step count within the target then starts there
// and costs two PLD evaluations instead of about five. It changes no
// answer, only the work to find it (the search finds the same limit from
// any start), and is not recorded. A no-op for RDP, n ≤ 0, or before
// Start.
func (l *Ledger) PlanSteps(n int64) {
	if b, ok := l.budget.(*pldBudget); ok && n > 0 {
		b.planned = n
	}
}

// Accountant returns the accountant the run enforces its budget with
// (AccountantRDP for a run record from before the field), "" before Start.
func (l *Ledger) Accountant() string {
	if l.run == nil {
		return ""
	}
	if l.run.Accountant == "" {
		return AccountantRDP
	}
	return l.run.Accountant
}

// LastIndex returns the Raft index of the last charge (0 if none). Whether
// an entry has been charged is Charged's answer, which also checks its
// history.
func (l *Ledger) LastIndex() uint64 { return l.lastIndex }

// Charges returns the number of charge records.
func (l *Ledger) Charges() uint64 { return l.charges }

// LastStep returns the highest step charged (0 if none): the step Spent's
// ε runs through, whether or not that step was ever applied.
func (l *Ledger) LastStep() int64 { return l.lastStep }

// Head returns the last record and the record count.
func (l *Ledger) Head() (Record, uint64) { return l.file.Head() }

// Path returns the ledger file's path.
func (l *Ledger) Path() string { return l.file.Path() }

// Close waits for the ledger's warming goroutine, if any, and closes the
// ledger file.
func (l *Ledger) Close() error {
	l.closing.Store(true) // the warming goroutine stops after its current grid count
	l.warming.Wait()
	return l.file.Close()
}

// Hold defers the fsync of the records Start, Charge and End append until
// Flush, so that a batch of Raft entries (a restarted replica applying its
// backlog) costs one fsync instead of one per charge. While held, a
// charge's record is written but not yet durable: the caller may apply
// the step's update in memory, but must Flush, and see it succeed, before
// anything derived from it leaves the process (θ released, a report of
// the step). A crash before Flush loses the held records, not a charge:
// Raft replays the entries after the restart and Charged finds them
// missing, so they are charged again.
func (l *Ledger) Hold() { l.file.Hold() }

// Flush ends Hold, fsyncing the records appended since the last fsync.
// An error wraps ErrBroken: the held records are cut off the file, every
// later append fails, and the caller must stop (as after a failed Charge).
func (l *Ledger) Flush() error { return l.file.Flush() }

// Size returns the byte length of the ledger's durable records (see
// File.Size).
func (l *Ledger) Size() int64 { return l.file.Size() }

// Run returns the run record, or false before Start.
func (l *Ledger) Run() (Record, bool) {
	if l.run == nil {
		return Record{}, false
	}
	return *l.run, true
}

// after returns the budget with e charged once more, leaving the ledger's
// own untouched.
func (l *Ledger) after(e accounting.Event) (budget, error) {
	next := l.budget.clone()
	if err := next.add(e); err != nil {
		return nil, err
	}
	return next, nil
}

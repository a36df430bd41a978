package coordinator

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
)

// Errors the state machine reports.
var (
	// ErrNotConfigured is returned for a step entry applied before the run
	// configuration entry.
	ErrNotConfigured = errors.New("coordinator: run not configured")
	// ErrStopped is returned for a step entry applied after the run stopped.
	ErrStopped = errors.New("coordinator: run stopped")
	// ErrEventMismatch is returned (in ApplyResult.Err) for a step entry
	// whose ledger event is not the run configuration's. The entry is
	// refused: not charged, not applied; the run stops.
	ErrEventMismatch = errors.New("coordinator: step entry's privacy event differs from the run configuration's")
	// ErrFatal wraps a failure after which this replica cannot go on
	// applying the log (the ledger could not be made durable, or an entry
	// could not be decoded). The process must stop; fail closed.
	ErrFatal = errors.New("coordinator: replica failed")
	// ErrUnmatchedGrad is returned (in ApplyResult.Err) for a grad entry
	// that does not name the pending charge: its g̃ is not applied, and the
	// run stops.
	ErrUnmatchedGrad = errors.New("coordinator: g̃ without a pending charge")
)

// InitFunc returns θ₀ for a run. It must be deterministic: every replica
// calls it with the same configuration and must get the same bits. The
// rule is RunConfig.Theta0; InitFromSpec makes the InitFunc that applies it.
type InitFunc func(RunConfig) ([]float32, error)

// ApplyResult is what FSM.Apply returns for each entry (the Response of the
// raft.ApplyFuture).
type ApplyResult struct {
	Step    int64  // step number the entry carried
	Index   uint64 // a charge entry's Raft index; a grad entry's charge index
	Charged bool   // a ledger record was written for it
	// Pending says a charge entry became the pending charge: the grad
	// entry naming Index will apply its g̃.
	Pending bool
	Applied bool    // the optimizer update was applied
	Epsilon float64 // ε spent after the entry
	Diag    dpadam.Diagnostics
	Err     error // why the entry was refused, if it was
}

// FSM is the replicated state machine: the run configuration, θ, the
// optimizer state and the privacy ledger. It implements raft.BatchingFSM.
//
// Apply is deterministic: it reads no clock, draws no randomness and does no
// network I/O, so the same log yields the same θ, optimizer state and ledger
// records, bit for bit, on every replica.
//
// A release reaches the log in two entries (the charge-ahead path):
//
//  1. A charge entry (chargeEntry: the step, the event, the round; no
//     tensor). Its event must be the run configuration's (else it is
//     refused and the run stops: an honest leader never proposes another).
//     Unless the ledger holds this entry's charge already (ledger.Charged:
//     same Raft history, index at or below its last charge), the
//     configuration's event is charged at the entry's history, term and
//     index: a record appended and fsynced (a charge that would exceed the
//     target ε is refused and the run stops; a ledger that cannot be
//     written, or one bound to another history, makes the replica fail
//     closed). A charge for the next step, while the run runs, becomes the
//     pending charge, replacing any earlier one: a leader that died after
//     its charge committed and before its g̃ did leaves a pending charge no
//     g̃ will ever match, and the next leader charges the step again (the
//     first charge stays: its θ may have been released; over-count, never
//     under-count).
//  2. A grad entry (gradEntry: g̃, and the Raft index of its charge). If
//     it names the pending charge, has the run's dimension and passes
//     dpadam.CheckGradient (the optimizer's own rule, which the leader also
//     applies before charging), the optimizer update is applied: θ moves.
//     Anything else is refused (not applied) and, since an honest leader
//     proposes g̃ only for its own pending charge, stops the run.
//
// The leader proposes the grad entry only once the charge entry is
// committed and applied on the leader, so g̃ is in no log and on no wire
// before its charge is durable on a quorum, and a g̃ on any replica's disk
// has a committed charge ahead of it in the log.
//
// Logs written before the charge-ahead path hold step entries (stepEntry),
// which charge and apply in one: decode and check as above, charge, then
// apply if the entry is the next step (a step entry for an already-applied
// step is charged, since its g̃ is committed, but changes nothing).
//
// The run ends in Apply, at one entry, the same on every replica (end): a
// stop entry, the charge the budget refuses, the g̃ of the last step
// (MaxSteps) or an entry refused as no honest leader's. The ledger then
// records the end (ledger.End: the reason, the last applied step, the
// entry's position), so every replica's ledger says how the run ended and
// how many steps it applied; a step charged ahead whose g̃ never came is
// charged there and not counted as applied. An ended run applies nothing
// more: the pending charge is dropped, and a later entry's release is
// charged as a replay (over-count, never under-count).
//
// After a restart the ledger may already hold charges for entries Raft
// replays (it is durable; the snapshot may be older); those are not charged
// twice, and their updates are applied if the restored state is behind.
// That deduplication is by Raft index, so it is sound only while the Raft
// state is the one the ledger charged from: the configuration entry binds
// the ledger to its Raft history (ledger.Start), and OpenReplica refuses to
// start a replica whose Raft state does not hold every entry its ledger
// charged (ledger.CheckRaftState).
//
// # Locking
//
// tmu guards the tensors (θ, the optimizer, the decode buffer, and
// thetaStep, the step θ is of); mu guards the rest (configuration, ledger,
// applied, pending, stopped). A grad entry's decode and update hold tmu
// only, so State and WouldExceed, which the leader's loop calls on every
// step, never wait for a model-sized update. Lock order: tmu before mu.
type FSM struct {
	tmu sync.RWMutex // the tensors; taken before mu
	mu  sync.RWMutex // everything else

	ledgerPath string
	ledgerOpts []ledger.Option
	init       InitFunc
	log        *slog.Logger

	ledger  *ledger.Ledger
	cfg     *RunConfig // set once, under both locks
	history string     // the Raft history ID the configuration entry carried
	applied int64      // last applied step
	pending *pendingCharge
	diag    dpadam.Diagnostics
	stopped string // non-empty once the run stopped, with the reason
	fatal   error
	// bindings maps each node ID to the content hash of the training
	// data it was first admitted with (bindEntry); nil until one.
	bindings map[string]string

	// Under tmu.
	theta     []float32
	opt       *dpadam.Optimizer
	grad      []float32 // decode buffer for g̃
	thetaStep int64     // the step θ is of (applied, as tmu's holders see it)

	// changed holds one signal after any Apply or Restore (Changed).
	changed chan struct{}
	// restores counts the snapshots restored (SnapshotsRestored).
	restores atomic.Uint64
	// spent is the ledger's ε (math.Float64bits) and chargedStep the
	// step it runs through (State.ChargedStep), as of the last entry
	// applied or snapshot restored (Spent, ChargedStep), stored under mu.
	spent       atomic.Uint64
	chargedStep atomic.Int64

	// Snapshots by bytes (Replica.snapshots): snapModels is
	// ReplicaConfig.SnapshotModels, snapMin ReplicaConfig.SnapshotMinBytes,
	// sinceSnap the g̃ bytes applied since
	// the last snapshot and stopAsked whether the stopped run's snapshot
	// was asked for (under mu); wantSnap holds one request.
	snapModels int64
	snapMin    int64
	sinceSnap  int64
	stopAsked  bool
	wantSnap   chan struct{}

	// onConfigured, if set, is told the run's dimension once it is
	// configured (applied or restored): the replica sizes its log's
	// segments to the model. onStopped, if set, is called once, in the
	// Apply that stops the run, before any snapshot of the stopped state
	// can be taken: the replica lowers TrailingLogs there.
	onConfigured func(dim int)
	onStopped    func()

	// snapFree holds the model-sized buffers of the last snapshot once
	// Raft released it, for the next (fsmSnapshot.Release).
	snapFree chan *snapBuffers
}

// askSnapshots asks the replica (Replica.snapshots, which reads State) for
// a snapshot when the g̃ applied since the last one reach snapModels
// copies of the model and at least snapMin bytes, and once when the run
// has stopped; without
// blocking: a request waiting stands for any number. Called with f.mu
// held, after every entry.
func (f *FSM) askSnapshots() {
	if f.cfg == nil {
		return
	}
	bytes := f.snapModels > 0 && f.sinceSnap >= max(f.snapModels*4*int64(f.cfg.Dim), f.snapMin)
	stop := f.stopped != "" && !f.stopAsked
	if !bytes && !stop {
		return
	}
	if stop && f.onStopped != nil {
		f.onStopped()
	}
	f.stopAsked = f.stopAsked || stop
	select {
	case f.wantSnap <- struct{}{}:
	default:
	}
}

// NewFSM opens (or creates) the ledger under dataDir and returns a state
// machine with no run configured. The ledger file is dataDir/ledger.log.
func NewFSM(dataDir string, init InitFunc, log *slog.Logger, opts ...ledger.Option) (*FSM, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	path := filepath.Join(dataDir, LedgerFile)
	l, err := ledger.Open(path, opts...)
	if err != nil {
		return nil, err
	}
	f := &FSM{ledgerPath: path, ledgerOpts: opts, init: init, log: log, ledger: l,
		changed: make(chan struct{}, 1), wantSnap: make(chan struct{}, 1), snapFree: make(chan *snapBuffers, 1)}
	f.storeSpent()
	return f, nil
}

// Changed returns a channel that holds a signal after the state changed
// (an entry applied, a snapshot restored): one signal for any number of
// changes since the last receive, so a reader re-reads State on each. It
// has one reader (the replica's Server); the signal is sent without
// blocking and carries nothing the log does not (determinism is
// unaffected).
func (f *FSM) Changed() <-chan struct{} { return f.changed }

// SnapshotsRestored is the number of snapshots this state machine
// restored: the replica's own at start and those a leader sent.
func (f *FSM) SnapshotsRestored() uint64 { return f.restores.Load() }

// notify signals Changed without blocking.
func (f *FSM) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// pendingCharge is a committed charge whose g̃ has not been applied: the
// one grad entry the state machine will accept next.
type pendingCharge struct {
	Step  int64  `msgpack:"step"`
	Index uint64 `msgpack:"index"` // the charge entry's Raft index
	Round string `msgpack:"round"`
}

// LedgerFile is the ledger's file name inside a replica's data directory.
const LedgerFile = "ledger.log"

// Apply applies one committed log entry. See the type's doc comment.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	defer f.notify() // after the locks are released
	return f.apply(l)
}

// ApplyBatch applies a batch of committed entries (raft.BatchingFSM), each
// as Apply does, in order, with the ledger held (ledger.Ledger.Hold) so
// that the batch's charges cost one fsync, at its end, instead of one
// each: a restarted replica applies its backlog up to MaxAppendEntries
// entries per fsync. Nothing leaves before that fsync: Raft answers the
// entries' futures (the leader releases θ and reports on them) only after
// ApplyBatch returns, Changed is signalled after it, and a snapshot is
// taken between batches. If the fsync fails, every entry of the batch is
// answered with the replica's fatal error, as a failed charge is.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	defer f.notify()
	f.mu.Lock()
	f.ledger.Hold()
	f.mu.Unlock()
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			out[i] = f.apply(l)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.ledger.Flush(); err != nil {
		fatal := f.failOnce(err)
		for i, r := range out {
			if ar, ok := r.(ApplyResult); ok {
				out[i] = ApplyResult{Step: ar.Step, Index: ar.Index, Err: fatal}
			}
		}
	}
	return out
}

// failOnce records err as fatal unless the replica failed already (a
// failed append in the batch broke the ledger first), and returns the
// fatal error. Called with f.mu held.
func (f *FSM) failOnce(err error) error {
	if f.fatal != nil {
		return f.fatal
	}
	return f.fail(err).Err
}

// apply is Apply without the change signal.
func (f *FSM) apply(l *raft.Log) any {
	f.tmu.Lock()
	defer f.tmu.Unlock()
	defer func() {
		f.mu.Lock()
		f.askSnapshots()
		f.storeSpent()
		f.mu.Unlock()
	}()
	f.mu.RLock()
	fatal := f.fatal
	f.mu.RUnlock()
	if fatal != nil {
		return ApplyResult{Err: fatal}
	}
	t, body, err := decodeEntry(l.Data)
	if err == nil && t == entryGrad {
		return f.applyGrad(l, body) // takes mu only briefly
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		return f.fail(err)
	}
	switch t {
	case entryConfig:
		return f.applyConfig(body)
	case entryStep:
		return f.applyStep(l, body)
	case entryCharge:
		return f.applyCharge(l, body)
	case entryBind:
		return f.applyBind(body)
	case entryStop:
		var s stopEntry
		if err := msgpack.Unmarshal(body, &s); err != nil {
			return f.fail(fmt.Errorf("%w: stop: %v", ErrBadEntry, err))
		}
		err := f.end(l, s.Reason)
		return ApplyResult{Step: f.applied, Epsilon: f.ledger.Spent(), Err: err}
	}
	return nil
}

// warmLedger tells the ledger the run's planned steps, where the budget
// check's one-time search starts (PLD), and starts computing the step
// limit and the grid's dense start off the apply path: on configuring the
// run, and on restoring a snapshot of a configured one (a restarted
// replica, which would otherwise meet the whole search at its first
// budget question, as a new leader on the failover's path).
func (f *FSM) warmLedger(c RunConfig) {
	f.ledger.PlanSteps(c.MaxSteps)
	f.ledger.Prewarm(c.Event())
}

// fail records a fatal error: this replica stops applying. Called with
// f.mu held.
func (f *FSM) fail(err error) ApplyResult {
	f.fatal = fmt.Errorf("%w: %w", ErrFatal, err)
	f.log.Error("replica failed; stopping", "err", err)
	return ApplyResult{Err: f.fatal}
}

func (f *FSM) applyConfig(body []byte) ApplyResult {
	ce, err := decodeConfig(body)
	if err != nil {
		return f.fail(err)
	}
	c := ce.RunConfig
	if f.cfg != nil {
		// A second configuration entry (a leader re-proposing after a
		// failover) must match, history included; it changes nothing.
		if !sameRun(*f.cfg, c) {
			return ApplyResult{Err: fmt.Errorf("%w: run already configured as %q", ErrInvalidRunConfig, f.cfg.Run)}
		}
		if ce.History != f.history {
			return ApplyResult{Err: fmt.Errorf("%w: configuration entry of history %q, the run's is %q", ledger.ErrHistoryMismatch, ce.History, f.history)}
		}
		return ApplyResult{Step: f.applied, Epsilon: f.ledger.Spent()}
	}
	if err := c.Validate(); err != nil {
		return ApplyResult{Err: err}
	}
	// Bind the ledger to this history (or check that it is bound to it: a
	// ledger of another history makes this replica fail closed).
	if err := f.ledger.StartRun(ledger.RunParams{Run: c.Run, TargetEpsilon: c.TargetEpsilon, Delta: c.Delta, Noise: c.SeedPolicy,
		Mechanism: c.NoiseMode, Accountant: c.Accountant, History: ce.History, Admission: c.Admission}); err != nil {
		return f.fail(err)
	}
	f.warmLedger(c)
	theta, err := f.init(c)
	if err != nil {
		return f.fail(fmt.Errorf("initializing θ₀: %w", err))
	}
	if len(theta) != c.Dim {
		return f.fail(fmt.Errorf("initializer returned %d parameters, config says %d", len(theta), c.Dim))
	}
	opt, err := dpadam.New(c.Optimizer, c.Dim)
	if err != nil {
		return f.fail(err)
	}
	f.cfg, f.history, f.theta, f.opt, f.grad, f.thetaStep = &c, ce.History, theta, opt, make([]float32, c.Dim), 0
	if f.onConfigured != nil {
		f.onConfigured(c.Dim)
	}
	f.log.Info("run configured", "run", c.Run, "history", ce.History, "dim", c.Dim, "q", c.SampleRate,
		"sigma", c.Optimizer.NoiseMultiplier, "target_epsilon", c.TargetEpsilon, "delta", c.Delta,
		"optimizer", c.Optimizer.Algorithm, "seed_policy", c.SeedPolicy, "noise_mode", noiseModeLabel(c.NoiseMode), "accountant", f.ledger.Accountant())
	return ApplyResult{}
}

// applyStep applies a legacy step entry (charge and g̃ in one; see the
// type's doc comment). Called with both locks held.
func (f *FSM) applyStep(l *raft.Log, body []byte) ApplyResult {
	// Decode g̃ first (straight into f.grad): an entry that cannot be
	// decoded is refused before anything is charged or applied,
	// identically on every replica.
	s, gradErr, err := decodeStepInto(body, f.grad)
	if err != nil {
		return f.fail(fmt.Errorf("%w: step: %v", ErrBadEntry, err))
	}
	if f.cfg == nil {
		return ApplyResult{Step: s.Step, Err: ErrNotConfigured}
	}
	res := ApplyResult{Step: s.Step, Epsilon: f.ledger.Spent()}
	if gradErr != nil {
		res.Err = gradErr
		return res
	}
	// A step entry that is not a release of this run (another event, or a
	// g̃ the optimizer refuses) is refused: not charged, not applied, not
	// fatal (every replica refuses it alike); the run stops.
	if err := f.checkStep(s); err != nil {
		f.stopRefused(l, s.Step, err)
		res.Err = err
		return res
	}
	// A new entry is charged even if it will not move θ (its g̃ is
	// committed, so it counts as released: over-count, never under-count).
	if !f.chargeNext(l, s.Step, &res) {
		return res
	}
	diag, err := f.opt.Step(f.theta, f.grad)
	if err != nil {
		// Cannot happen for a g̃ that passed checkStep; if it does, this
		// replica can no longer follow the log.
		return f.fail(err)
	}
	f.applied, f.thetaStep, f.pending = s.Step, s.Step, nil
	f.sinceSnap += 4 * int64(len(f.grad))
	f.diag = diag
	res.Applied, res.Diag = true, diag
	if f.cfg.MaxSteps > 0 && f.applied >= f.cfg.MaxSteps {
		res.Err = f.end(l, stopMaxSteps)
	}
	return res
}

// charge charges the configuration's event for the entry at l (a charge
// entry, or a legacy step entry) unless the durable ledger holds its
// charge already (Raft replaying entries of the same history after a
// restart: the ledger decides, see ledger.Charged). unapplied marks a
// charge whose g̃ will not move θ. It returns whether a record was
// written; an error wrapping ledger.ErrBudgetExceeded stops the run (done
// here); any other error is fatal (returned as fatal, already recorded).
// Called with f.mu held.
func (f *FSM) charge(l *raft.Log, step int64, unapplied bool) (charged bool, refused, fatal error) {
	pos := ledger.Position{History: f.history, Term: l.Term, Index: l.Index}
	done, err := f.ledger.Charged(pos)
	if err != nil {
		return false, nil, f.fail(err).Err
	}
	if done {
		return false, nil, nil
	}
	_, err = f.ledger.Charge(step, f.cfg.Event(), pos, unapplied)
	switch {
	case errors.Is(err, ledger.ErrBudgetExceeded):
		f.log.Warn("step refused: privacy budget exhausted", "step", step, "epsilon", f.ledger.Spent())
		if ferr := f.end(l, stopBudget); ferr != nil {
			return false, nil, ferr
		}
		return false, err, nil
	case err != nil:
		return false, nil, f.fail(err).Err
	}
	return true, nil, nil
}

// chargeNext charges the release at l, of step (charge), into res, and
// reports whether it moves θ: the next step, while the run runs. When not,
// res.Err says why. Called with f.mu held.
func (f *FSM) chargeNext(l *raft.Log, step int64, res *ApplyResult) bool {
	next := f.stopped == "" && step == f.applied+1
	charged, refused, fatal := f.charge(l, step, !next)
	res.Charged, res.Epsilon = charged, f.ledger.Spent()
	switch {
	case fatal != nil:
		res.Err = fatal
	case refused != nil:
		res.Err = refused
	case !next:
		res.Err = f.notNext(step)
	default:
		return true
	}
	return false
}

// applyCharge applies a charge entry (step 1 of the type's doc comment).
// Called with both locks held.
func (f *FSM) applyCharge(l *raft.Log, body []byte) ApplyResult {
	var c chargeEntry
	if err := msgpack.Unmarshal(body, &c); err != nil {
		return f.fail(fmt.Errorf("%w: charge: %v", ErrBadEntry, err))
	}
	if f.cfg == nil {
		return ApplyResult{Step: c.Step, Err: ErrNotConfigured}
	}
	res := ApplyResult{Step: c.Step, Index: l.Index}
	if want := f.cfg.Event(); !c.Event.Equal(want) {
		err := fmt.Errorf("%w: step %d claims %+v, the run configuration's event is %+v", ErrEventMismatch, c.Step, c.Event, want)
		f.stopRefused(l, c.Step, err)
		res.Err, res.Epsilon = err, f.ledger.Spent()
		return res
	}
	if !f.chargeNext(l, c.Step, &res) {
		return res
	}
	if p := f.pending; p != nil {
		f.log.Info("step charged again: the earlier charge's g̃ was never committed", "step", c.Step,
			"earlier_index", p.Index, "earlier_round", p.Round, "index", l.Index, "round", c.Round)
	}
	f.pending = &pendingCharge{Step: c.Step, Index: l.Index, Round: c.Round}
	res.Pending = true
	return res
}

// applyGrad applies a grad entry (step 2 of the type's doc comment).
// Called with f.tmu held; it takes f.mu around its reads and writes of
// the rest of the state, not around the model-sized decode and update.
func (f *FSM) applyGrad(l *raft.Log, body []byte) ApplyResult {
	f.mu.RLock()
	configured := f.cfg != nil
	f.mu.RUnlock()
	g, gradErr, err := decodeGradInto(body, f.grad)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err != nil:
		return f.fail(fmt.Errorf("%w: grad: %v", ErrBadEntry, err))
	case !configured:
		return ApplyResult{Step: g.Step, Err: ErrNotConfigured}
	}
	res := ApplyResult{Step: g.Step, Index: g.Charge, Epsilon: f.ledger.Spent()}
	p := f.pending
	switch {
	case gradErr != nil:
		res.Err = fmt.Errorf("coordinator: step %d: %w", g.Step, gradErr)
	case p == nil || p.Index != g.Charge || p.Step != g.Step:
		res.Err = fmt.Errorf("%w: g̃ of step %d names the charge at index %d, the pending charge is %+v", ErrUnmatchedGrad, g.Step, g.Charge, p)
	case g.Step != f.applied+1:
		// Cannot happen: a charge is pending only for the next step,
		// and the end of the run drops it (end): a g̃ after the end
		// names no pending charge.
		res.Err = f.notNext(g.Step)
	}
	if res.Err != nil {
		f.stopRefused(l, g.Step, res.Err)
		return res
	}
	// The update, under tmu only (held by Apply). Step applies the
	// validity rule itself (dpadam.CheckGradient) before it writes
	// anything: a g̃ it refuses is refused here, not fatal, and g̃ is
	// scanned once.
	f.mu.Unlock()
	diag, err := f.opt.Step(f.theta, f.grad)
	if err == nil {
		f.thetaStep = g.Step
	}
	f.mu.Lock()
	switch {
	case errors.Is(err, dpadam.ErrNonFinite):
		res.Err = fmt.Errorf("coordinator: step %d: %w", g.Step, err)
		f.stopRefused(l, g.Step, res.Err)
		return res
	case err != nil:
		// Cannot happen for a g̃ of the run's dimension; if it does, this
		// replica can no longer follow the log.
		return f.fail(err)
	}
	f.applied, f.pending, f.diag = g.Step, nil, diag
	f.sinceSnap += 4 * int64(len(f.grad))
	res.Applied, res.Diag = true, diag
	if f.cfg.MaxSteps > 0 && f.applied >= f.cfg.MaxSteps {
		res.Err = f.end(l, stopMaxSteps)
	}
	return res
}

// notNext is why an entry for step does not move θ. Called with f.mu held.
func (f *FSM) notNext(step int64) error {
	if f.stopped != "" {
		return fmt.Errorf("%w: %s", ErrStopped, f.stopped)
	}
	return fmt.Errorf("coordinator: step %d is not the next step (%d applied)", step, f.applied)
}

// stopRefused stops the run at l after a refused entry an honest leader
// never proposes (fail closed; every replica refuses it alike). Called
// with f.mu held.
func (f *FSM) stopRefused(l *raft.Log, step int64, err error) {
	if f.stopped == "" {
		f.log.Error("step entry refused; run stopped", "step", step, "err", err)
		_ = f.end(l, fmt.Sprintf("refused step %d: %v", step, err)) // a failure is fatal, recorded
	}
}

// end ends the run at the entry l for reason (non-empty; an empty one ends
// nothing). It is the one place a run ends, in Apply, so on every replica
// at the same entry: the state stops, the pending charge is dropped (an
// ended run applies no more g̃; a step charged ahead whose g̃ had not come
// stays charged and is never applied), and the ledger records the end
// (ledger.End: the reason, the last applied step, l's position), so every
// replica's ledger states the same end, byte for byte. Raft replaying l
// after a restart records nothing new (End is idempotent). A no-op once
// the run has stopped. It returns the fatal error (recorded: fail closed)
// if the ledger cannot record the end. Called with f.mu held.
func (f *FSM) end(l *raft.Log, reason string) error {
	if f.stopped != "" || reason == "" {
		return nil
	}
	f.stopped, f.pending = reason, nil
	f.log.Info("run stopped", "reason", reason, "step", f.applied)
	if f.cfg == nil {
		return nil // no run configured: its ledger holds no run to end
	}
	pos := ledger.Position{History: f.history, Term: l.Term, Index: l.Index}
	if _, err := f.ledger.End(f.applied, reason, pos); err != nil {
		return f.fail(err).Err
	}
	return nil
}

// checkStep reports why a decoded step entry (g̃ in f.grad) is not a
// release of the configured run: an event other than the configuration's
// (ErrEventMismatch), or a g̃ the optimizer would refuse (an error wrapping
// dpadam.ErrNonFinite, without the offending element). Called with f.mu
// held.
func (f *FSM) checkStep(s stepEntry) error {
	if want := f.cfg.Event(); !s.Event.Equal(want) {
		return fmt.Errorf("%w: step %d claims %+v, the run configuration's event is %+v", ErrEventMismatch, s.Step, s.Event, want)
	}
	if !dpadam.GradientValid(f.grad) {
		// Not CheckGradient's error, which names an element of g̃ and its
		// value: the entry is refused uncharged, and the reason goes to
		// the ledger's end record and the logs.
		return fmt.Errorf("coordinator: step %d: %w", s.Step, dpadam.ErrNonFinite)
	}
	return nil
}

// Close closes the ledger.
func (f *FSM) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ledger.Close()
}

var _ raft.BatchingFSM = (*FSM)(nil)
var _ io.Closer = (*FSM)(nil)

package coordinator

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"

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
)

// InitFunc returns θ₀ for a run. It must be deterministic: every replica
// calls it with the same configuration and must get the same bits.
type InitFunc func(RunConfig) ([]float32, error)

// ApplyResult is what FSM.Apply returns for each entry (the Response of the
// raft.ApplyFuture).
type ApplyResult struct {
	Step    int64   // step number the entry carried
	Charged bool    // a ledger record was written for it
	Applied bool    // the optimizer update was applied
	Epsilon float64 // ε spent after the entry
	Diag    dpadam.Diagnostics
	Err     error // why the entry was refused, if it was
}

// FSM is the replicated state machine: the run configuration, θ, the
// optimizer state and the privacy ledger. It implements raft.FSM.
//
// Apply is deterministic: it reads no clock, draws no randomness and does no
// network I/O, so the same log yields the same θ, optimizer state and ledger
// records, bit for bit, on every replica. For a step entry it does, in
// order:
//
//  1. decode and check the entry: g̃ has the run's dimension, the entry's
//     event is the run configuration's (Event), and g̃ passes
//     dpadam.CheckGradient, the optimizer's own rule, which the leader
//     also applies before proposing. An entry that fails is refused: not
//     charged, not applied, not fatal; a wrong event or an invalid g̃ also
//     stops the run, since an honest leader never proposes one;
//  2. unless the ledger has charged the entry already (ledger.Charged:
//     same Raft history, index at or below its last charge), charge the
//     configuration's event at the entry's history, term and index:
//     append a record and fsync (a charge that would exceed the target ε
//     is refused and the run stops; a ledger that cannot be written, or
//     one bound to another history, makes the replica fail closed);
//  3. only then, if the entry is the next step, apply the optimizer update.
//     A step entry for an already-applied step is charged (the release
//     happened: its g̃ is committed) but changes nothing.
//
// After a restart the ledger may already hold charges for entries Raft
// replays (it is durable; the snapshot may be older); those are not charged
// twice, and their updates are applied if the restored state is behind.
// That deduplication is by Raft index, so it is sound only while the Raft
// state is the one the ledger charged from: the configuration entry binds
// the ledger to its Raft history (ledger.Start), and OpenReplica refuses to
// start a replica whose Raft state does not hold every entry its ledger
// charged (ledger.CheckRaftState).
type FSM struct {
	mu sync.RWMutex

	ledgerPath string
	ledgerOpts []ledger.Option
	init       InitFunc
	log        *slog.Logger

	ledger  *ledger.Ledger
	cfg     *RunConfig
	history string // the Raft history ID the configuration entry carried
	theta   []float32
	opt     *dpadam.Optimizer
	grad    []float32 // decode buffer for g̃
	applied int64     // last applied step
	diag    dpadam.Diagnostics
	stopped string // non-empty once the run stopped, with the reason
	fatal   error

	// changed holds one signal after any Apply or Restore (Changed).
	changed chan struct{}
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
	return &FSM{ledgerPath: path, ledgerOpts: opts, init: init, log: log, ledger: l,
		changed: make(chan struct{}, 1)}, nil
}

// Changed returns a channel that holds a signal after the state changed
// (an entry applied, a snapshot restored): one signal for any number of
// changes since the last receive, so a reader re-reads State on each. It
// has one reader (the replica's Server); the signal is sent without
// blocking and carries nothing the log does not (determinism is
// unaffected).
func (f *FSM) Changed() <-chan struct{} { return f.changed }

// notify signals Changed without blocking.
func (f *FSM) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// LedgerFile is the ledger's file name inside a replica's data directory.
const LedgerFile = "ledger.log"

// Apply applies one committed log entry. See the type's doc comment.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	defer f.notify() // after the lock is released
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fatal != nil {
		return ApplyResult{Err: f.fatal}
	}
	t, body, err := decodeEntry(l.Data)
	if err != nil {
		return f.fail(err)
	}
	switch t {
	case entryConfig:
		return f.applyConfig(body)
	case entryStep:
		return f.applyStep(l, body)
	case entryStop:
		var s stopEntry
		if err := msgpack.Unmarshal(body, &s); err != nil {
			return f.fail(fmt.Errorf("%w: stop: %v", ErrBadEntry, err))
		}
		if f.stopped == "" {
			f.stopped = s.Reason
			f.log.Info("run stopped", "reason", s.Reason, "step", f.applied)
		}
		return ApplyResult{Step: f.applied, Epsilon: f.ledger.Spent()}
	}
	return nil
}

// fail records a fatal error: this replica stops applying.
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
		if !sameConfig(*f.cfg, c) {
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
	if err := f.ledger.Start(c.Run, c.TargetEpsilon, c.Delta, c.SeedPolicy, c.NoiseMode, c.Accountant, ce.History); err != nil {
		return f.fail(err)
	}
	f.ledger.PlanSteps(c.MaxSteps) // where the budget check's one-time search starts (PLD)
	f.ledger.Prewarm(c.Event())    // the step limit and the grid's dense start, off the apply path
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
	f.cfg, f.history, f.theta, f.opt, f.grad = &c, ce.History, theta, opt, make([]float32, c.Dim)
	f.log.Info("run configured", "run", c.Run, "history", ce.History, "dim", c.Dim, "q", c.SampleRate,
		"sigma", c.Optimizer.NoiseMultiplier, "target_epsilon", c.TargetEpsilon, "delta", c.Delta,
		"optimizer", c.Optimizer.Algorithm, "seed_policy", c.SeedPolicy, "noise_mode", noiseModeLabel(c.NoiseMode), "accountant", f.ledger.Accountant())
	return ApplyResult{}
}

func (f *FSM) applyStep(l *raft.Log, body []byte) ApplyResult {
	// 1. Decode g̃ first (straight into f.grad): an entry that cannot be
	// decoded is refused before anything is charged or applied,
	// identically on every replica.
	s, gradErr, err := decodeStepInto(body, f.grad)
	if err != nil {
		return f.fail(fmt.Errorf("%w: step: %v", ErrBadEntry, err))
	}
	if f.cfg == nil {
		return ApplyResult{Step: s.Step, Err: ErrNotConfigured}
	}
	res := ApplyResult{Step: s.Step}
	if gradErr != nil {
		res.Err = gradErr
		res.Epsilon = f.ledger.Spent()
		return res
	}
	// Then check that the entry is a release of this run: it claims the
	// configuration's event and its g̃ is one the optimizer accepts
	// (dpadam.CheckGradient, the rule the leader applies before proposing).
	// An entry that is not is refused: not charged (the ledger records only
	// the configuration's mechanism, and this entry is not a release of
	// it), not applied (θ never reflects it, so nothing derived from it is
	// broadcast), and not fatal (every replica refuses it alike). An honest
	// leader never proposes one, so the run stops: fail closed.
	if err := f.checkStep(s); err != nil {
		if f.stopped == "" {
			f.stopped = fmt.Sprintf("refused step %d: %v", s.Step, err)
			f.log.Error("step entry refused; run stopped", "step", s.Step, "err", err)
		}
		res.Err = err
		res.Epsilon = f.ledger.Spent()
		return res
	}
	// Whether this entry will move θ: the next step, while running.
	// Anything else is still charged if it is new (its g̃ is committed, so
	// it counts as released: over-count, never under-count) but is marked
	// as not applied.
	willApply := f.stopped == "" && s.Step == f.applied+1

	// 2. Charge the configuration's event, unless the durable ledger
	// already holds this entry's charge (Raft replaying entries of the
	// same history after a restart: the ledger decides, see
	// ledger.Charged).
	pos := ledger.Position{History: f.history, Term: l.Term, Index: l.Index}
	charged, err := f.ledger.Charged(pos)
	if err != nil {
		return f.fail(err)
	}
	if !charged {
		_, err := f.ledger.Charge(s.Step, f.cfg.Event(), pos, !willApply)
		switch {
		case errors.Is(err, ledger.ErrBudgetExceeded):
			f.stopped = stopBudget
			f.log.Warn("step refused: privacy budget exhausted", "step", s.Step, "epsilon", f.ledger.Spent())
			res.Err = err
			res.Epsilon = f.ledger.Spent()
			return res
		case err != nil:
			return f.fail(err)
		}
		res.Charged = true
	}
	res.Epsilon = f.ledger.Spent()
	if !willApply {
		switch {
		case f.stopped != "":
			res.Err = fmt.Errorf("%w: %s", ErrStopped, f.stopped)
		default:
			res.Err = fmt.Errorf("coordinator: step %d is not the next step (%d applied)", s.Step, f.applied)
		}
		return res
	}
	// 3. Apply.
	diag, err := f.opt.Step(f.theta, f.grad)
	if err != nil {
		// Cannot happen for a g̃ that passed checkStep; if it does, this
		// replica can no longer follow the log.
		return f.fail(err)
	}
	f.applied = s.Step
	f.diag = diag
	res.Applied, res.Diag = true, diag
	if f.cfg.MaxSteps > 0 && f.applied >= f.cfg.MaxSteps {
		f.stopped = stopMaxSteps
	}
	return res
}

// checkStep reports why a decoded step entry (g̃ in f.grad) is not a
// release of the configured run: an event other than the configuration's
// (ErrEventMismatch), or a g̃ the optimizer would refuse (an error wrapping
// dpadam.ErrNonFinite). Called with f.mu held.
func (f *FSM) checkStep(s stepEntry) error {
	if want := f.cfg.Event(); !s.Event.Equal(want) {
		return fmt.Errorf("%w: step %d claims %+v, the run configuration's event is %+v", ErrEventMismatch, s.Step, s.Event, want)
	}
	if err := dpadam.CheckGradient(f.grad); err != nil {
		return fmt.Errorf("coordinator: step %d: %w", s.Step, err)
	}
	return nil
}

func sameConfig(a, b RunConfig) bool {
	ab, err1 := msgpack.Marshal(a)
	bb, err2 := msgpack.Marshal(b)
	return err1 == nil && err2 == nil && string(ab) == string(bb)
}

// State is a read-only view of the replica's state for the leader loop,
// status and metrics. It holds only public or privatized values.
type State struct {
	Configured bool
	Run        string
	Applied    int64 // last applied step
	Epsilon    float64
	Charges    uint64
	Stopped    string
	Fatal      error
	Diag       dpadam.Diagnostics
}

// State returns the current state.
func (f *FSM) State() State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := State{Applied: f.applied, Epsilon: f.ledger.Spent(), Charges: f.ledger.Charges(),
		Stopped: f.stopped, Fatal: f.fatal, Diag: f.diag}
	if f.cfg != nil {
		s.Configured, s.Run = true, f.cfg.Run
	}
	return s
}

// configuredHistory returns the history ID and whether the configuration
// has been applied, read together.
func (f *FSM) configuredHistory() (string, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.history, f.cfg != nil
}

// checkRaftState reports whether this replica's ledger may resume on a Raft
// state st (ledger.CheckRaftState). OpenReplica calls it before Raft starts.
func (f *FSM) checkRaftState(st ledger.RaftState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ledger.CheckRaftState(st)
}

// Config returns the run configuration, or false before it is applied.
func (f *FSM) Config() (RunConfig, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.cfg == nil {
		return RunConfig{}, false
	}
	return *f.cfg, true
}

// Params copies the committed θ into dst (grown as needed) and returns it
// with the step it belongs to. θ only ever reflects committed entries.
func (f *FSM) Params(dst []float32) ([]float32, int64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	dst = append(dst[:0], f.theta...)
	return dst, f.applied
}

// Digest returns the SHA-256 (hex) of the replica's training state: the
// last applied step, θ and the optimizer's binary state (dpadam
// MarshalBinary). Replicas that applied the same log have equal digests;
// comparing them checks that they agree bit for bit.
func (f *FSM) Digest() (string, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.digestLocked()
}

// digestLocked is Digest for callers holding f.mu.
func (f *FSM) digestLocked() (string, error) {
	h := sha256.New()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(f.applied))
	h.Write(buf[:])
	if f.cfg != nil {
		theta := make([]byte, 4*len(f.theta))
		putFloats(theta, f.theta)
		h.Write(theta)
		opt, err := f.opt.MarshalBinary()
		if err != nil {
			return "", err
		}
		h.Write(opt)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WouldExceed reports whether one more step would exceed the budget.
func (f *FSM) WouldExceed() (bool, error) {
	f.mu.Lock() // WouldExceed mutates and restores the accountant
	defer f.mu.Unlock()
	if f.cfg == nil {
		return false, ErrNotConfigured
	}
	return f.ledger.WouldExceed(f.cfg.Event())
}

// Close closes the ledger.
func (f *FSM) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ledger.Close()
}

var _ raft.FSM = (*FSM)(nil)
var _ io.Closer = (*FSM)(nil)

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
//  1. decode and check the entry (step number, dimension);
//  2. if the entry's Raft index is above the ledger's last charged index,
//     charge it: append a record and fsync (a charge that would exceed the
//     target ε is refused and the run stops; a ledger that cannot be
//     written makes the replica fail closed);
//  3. only then, if the entry is the next step, apply the optimizer update.
//     A step entry for an already-applied step is charged (the release
//     happened: its g̃ is committed) but changes nothing.
//
// After a restart the ledger may already hold charges for entries Raft
// replays (it is durable; the snapshot may be older); those are not charged
// twice, and their updates are applied if the restored state is behind.
type FSM struct {
	mu sync.RWMutex

	ledgerPath string
	ledgerOpts []ledger.Option
	init       InitFunc
	log        *slog.Logger

	ledger  *ledger.Ledger
	cfg     *RunConfig
	theta   []float32
	opt     *dpadam.Optimizer
	grad    []float32 // decode buffer for g̃
	applied int64     // last applied step
	diag    dpadam.Diagnostics
	stopped string // non-empty once the run stopped, with the reason
	fatal   error
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
	return &FSM{ledgerPath: path, ledgerOpts: opts, init: init, log: log, ledger: l}, nil
}

// LedgerFile is the ledger's file name inside a replica's data directory.
const LedgerFile = "ledger.log"

// Apply applies one committed log entry. See the type's doc comment.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
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
	var c RunConfig
	if err := msgpack.Unmarshal(body, &c); err != nil {
		return f.fail(fmt.Errorf("%w: config: %v", ErrBadEntry, err))
	}
	if f.cfg != nil {
		// A second configuration entry (a leader re-proposing after a
		// failover) must match; it changes nothing.
		if !sameConfig(*f.cfg, c) {
			return ApplyResult{Err: fmt.Errorf("%w: run already configured as %q", ErrInvalidRunConfig, f.cfg.Run)}
		}
		return ApplyResult{Step: f.applied, Epsilon: f.ledger.Spent()}
	}
	if err := c.Validate(); err != nil {
		return ApplyResult{Err: err}
	}
	if err := f.ledger.Start(c.Run, c.TargetEpsilon, c.Delta, c.SeedPolicy, c.NoiseMode); err != nil {
		return f.fail(err)
	}
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
	f.cfg, f.theta, f.opt, f.grad = &c, theta, opt, make([]float32, c.Dim)
	f.log.Info("run configured", "run", c.Run, "dim", c.Dim, "q", c.SampleRate,
		"sigma", c.Optimizer.NoiseMultiplier, "target_epsilon", c.TargetEpsilon, "delta", c.Delta,
		"optimizer", c.Optimizer.Algorithm, "seed_policy", c.SeedPolicy, "noise_mode", noiseModeLabel(c.NoiseMode))
	return ApplyResult{}
}

func (f *FSM) applyStep(l *raft.Log, body []byte) ApplyResult {
	var s stepEntry
	if err := msgpack.Unmarshal(body, &s); err != nil {
		return f.fail(fmt.Errorf("%w: step: %v", ErrBadEntry, err))
	}
	if f.cfg == nil {
		return ApplyResult{Step: s.Step, Err: ErrNotConfigured}
	}
	res := ApplyResult{Step: s.Step}
	// Decode g̃ first: an entry that cannot be decoded is refused before
	// anything is charged or applied, identically on every replica.
	if err := getFloats(f.grad, s.Grad); err != nil {
		res.Err = err
		res.Epsilon = f.ledger.Spent()
		return res
	}
	// Whether this entry will move θ: the next step, finite, while running.
	// Anything else is still charged if it is new (its g̃ is committed, so
	// it counts as released: over-count, never under-count) but is marked
	// as not applied.
	willApply := f.stopped == "" && s.Step == f.applied+1 && allFinite(f.grad)

	// 2. Charge, unless the durable ledger already holds this entry's
	// charge (Raft replaying entries after a restart).
	if l.Index > f.ledger.LastIndex() {
		_, err := f.ledger.Charge(s.Step, s.Event, l.Term, l.Index, !willApply)
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
		case s.Step != f.applied+1:
			res.Err = fmt.Errorf("coordinator: step %d is not the next step (%d applied)", s.Step, f.applied)
		default:
			res.Err = fmt.Errorf("%w: step %d", dpadam.ErrNonFinite, s.Step)
		}
		return res
	}
	// 3. Apply.
	diag, err := f.opt.Step(f.theta, f.grad)
	if err != nil {
		// Cannot happen for a finite g̃ of the right length; if it does,
		// this replica can no longer follow the log.
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

func allFinite(v []float32) bool {
	for _, x := range v {
		if x-x != 0 { // NaN or ±Inf
			return false
		}
	}
	return true
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

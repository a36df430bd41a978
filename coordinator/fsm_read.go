package coordinator

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
)

// The state machine's reads: the views the leader's loop, the reports and
// the tests take of it (State, Config, Params, Digest), and the budget
// question (WouldExceed). Each takes the state machine's lock for reading
// only as long as it copies.

// State is a read-only view of the replica's state for the leader loop,
// status and metrics. It holds only public or privatized values.
type State struct {
	Configured bool
	Run        string
	// History is the run's history ID, once configured: what tells this
	// replica group from another under the same run name.
	History string
	Applied int64 // last applied step
	// Epsilon is the ε the ledger has spent (ledger.Spent), over Charges
	// charge records, through ChargedStep, the highest step charged
	// (ledger.LastStep): Applied, or Applied+1 while a step charged ahead
	// waits for its g̃ (its θ may be out) and after the run ended between
	// that charge and its update (the charge stays; the step is never
	// applied). Every report of ε pairs it with ChargedStep, read here
	// with it. Charges exceeds ChargedStep when a step was charged again
	// after a leader change (over-count, never under-count).
	Epsilon     float64
	Charges     uint64
	ChargedStep int64
	Stopped     string
	Fatal       error
	Diag        dpadam.Diagnostics
	// PendingStep and PendingIndex are the pending charge's step and Raft
	// index: charged, its g̃ not applied (0: none).
	PendingStep  int64
	PendingIndex uint64
}

// Spent returns the ε the ledger has charged, as of the last entry applied
// or snapshot restored, without taking the state machine's lock: the
// metrics read it while an apply or a restore (a ledger replayed from
// disk) may hold the lock for a while. It is stored at the end of each
// entry's apply, before Raft answers the entry and so before anything of
// the step leaves the leader: no step's θ is ever out with Spent below
// the ε charged for it.
func (f *FSM) Spent() float64 { return math.Float64frombits(f.spent.Load()) }

// ChargedStep returns the step Spent's ε runs through (State.ChargedStep),
// stored with it, without taking the state machine's lock.
func (f *FSM) ChargedStep() int64 { return f.chargedStep.Load() }

// storeSpent records the ledger's ε for Spent and its last charged step
// for ChargedStep. Called with f.mu held.
func (f *FSM) storeSpent() {
	f.chargedStep.Store(f.chargedStepLocked())
	f.spent.Store(math.Float64bits(f.ledger.Spent()))
}

// chargedStepLocked is State.ChargedStep: the highest step the ledger
// charged, never below the applied step. Called with f.mu held.
func (f *FSM) chargedStepLocked() int64 { return max(f.applied, f.ledger.LastStep()) }

// State returns the current state.
func (f *FSM) State() State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := State{Applied: f.applied, Epsilon: f.ledger.Spent(), Charges: f.ledger.Charges(),
		ChargedStep: f.chargedStepLocked(), Stopped: f.stopped, Fatal: f.fatal, Diag: f.diag}
	if p := f.pending; p != nil {
		s.PendingStep, s.PendingIndex = p.Step, p.Index
	}
	if f.cfg != nil {
		s.Configured, s.Run, s.History = true, f.cfg.Run, f.history
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
	f.tmu.RLock()
	defer f.tmu.RUnlock()
	dst = append(dst[:0], f.theta...)
	return dst, f.thetaStep
}

// CopyTraining copies the committed θ into theta (grown as needed) and the
// optimizer's state into opt, read together, and returns θ and the step
// they are of. It is false before the run is configured. The leader keeps
// such a copy one step ahead of the state machine (the loop's ahead).
func (f *FSM) CopyTraining(theta []float32, opt *dpadam.Optimizer) ([]float32, int64, bool) {
	f.tmu.RLock()
	defer f.tmu.RUnlock()
	if f.opt == nil {
		return theta, 0, false
	}
	theta = append(theta[:0], f.theta...)
	opt.CopyFrom(f.opt)
	return theta, f.thetaStep, true
}

// Digest returns the SHA-256 (hex) of the replica's training state: the
// last applied step, θ and the optimizer's binary state (dpadam
// MarshalBinary). Replicas that applied the same log have equal digests;
// comparing them checks that they agree bit for bit.
func (f *FSM) Digest() (string, error) {
	f.tmu.RLock()
	defer f.tmu.RUnlock()
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.digestLocked()
}

// digestLocked is Digest for callers holding both locks.
func (f *FSM) digestLocked() (string, error) {
	h := sha256.New()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(f.thetaStep))
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

// WouldExceed reports whether one more step would exceed the budget. It
// holds the state machine's lock only to read the ledger: the
// accountant's search (the PLD step limit, seconds the first time) runs
// after it, so Raft's applies and the replica's reports go on meanwhile
// (issue 28; issue 27 measured 16–21 s replica restarts stuck behind it).
func (f *FSM) WouldExceed() (bool, error) {
	f.mu.Lock() // the ledger may add a series to its cache
	if f.cfg == nil {
		f.mu.Unlock()
		return false, ErrNotConfigured
	}
	check, err := f.ledger.ExceedsCheck(f.cfg.Event())
	f.mu.Unlock()
	if err != nil {
		return false, err
	}
	return check()
}

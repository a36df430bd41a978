package coordinator

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/raftlog"
)

// Reading a replica's state offline (ReadCommitted), for export.
//
// What is "committed" offline: hashicorp/raft does not persist the commit
// index, so the Raft log alone cannot say which of its entries were
// committed. The ledger can: the state machine charges a step entry (and
// fsyncs the charge) before it applies it, and it applies only committed
// entries, so every step this replica applied has a charge record at its
// Raft index, and every entry at or below the ledger's last charged index
// was committed. ReadCommitted therefore takes the newest snapshot that
// decodes and replays the log entries after it up to the ledger's last
// charged index (or the snapshot's index, if that is later) through a
// fresh state machine: the result is θ at the last step this replica
// applied, which is committed. Entries the replica has not applied yet
// (or were appended but never committed) are left out: conservative,
// never ahead of what a replica has acknowledged.
//
// Read-only: ReadCommitted opens nothing in the data dir for writing and
// takes no lock there. The Raft log (a bbolt file, which a running
// replica holds under an exclusive flock) is copied to a temporary
// directory, checking bbolt's meta pages so that no commit happened
// during the copy (see copyBolt), and read from the copy; snapshots and
// the ledger are plain files, read with os.Open. It is safe while the
// replica runs: a read that races with the replica (a log compacted or a
// snapshot reaped between reading the ledger and reading the log) is
// retried.

// ErrNoReplicaState is returned (wrapped, with the reason) by
// ReadCommitted for a data dir that is missing, empty, or holds no
// configured run.
var ErrNoReplicaState = errors.New("coordinator: no replica state in data dir")

// ErrInconsistentState is returned (wrapped) by ReadCommitted when the
// snapshot, the Raft log and the ledger of a data dir do not agree: an
// entry the ledger charged is missing from the log, or replaying the log
// does not reproduce the ledger's records.
var ErrInconsistentState = errors.New("coordinator: replica state does not agree with its ledger")

// Committed is a replica's training state at its last committed step, read
// offline by ReadCommitted. It holds only public or privatized values.
type Committed struct {
	Config RunConfig
	Step   int64 // last applied (committed) step; 0 before the first
	// Charged is the last step charged (State.ChargedStep): Step, or
	// Step+1 when that step's charge is applied and its g̃ is not (yet, or
	// ever: the run ended between them). Epsilon is the ε spent through
	// it.
	Charged int64
	Theta   []float32 // θ after Step
	Epsilon float64   // ε spent at the run's δ, from the ledger
	Charges uint64    // ledger charge records
	Stopped string    // why the run stopped, "" if it had not
	// Digest is FSM.Digest of the state: equal to Summary.Digest of the
	// replica that ran to this step.
	Digest string
}

// readAttempts bounds ReadCommitted's retries of a read that raced with
// the running replica.
const readAttempts = 5

// ReadCommitted reads the replica data dir dataDir offline and returns the
// state at its last committed step (see the comment above on what
// committed means offline). init must be the InitFunc the replica runs
// with (θ₀ for a log that starts with the configuration entry). It returns
// an error wrapping ErrNoReplicaState for a dir without a configured run,
// and ErrInconsistentState when the dir's parts disagree.
func ReadCommitted(dataDir string, init InitFunc) (Committed, error) {
	st, err := os.Stat(dataDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Committed{}, fmt.Errorf("%w: %s does not exist", ErrNoReplicaState, dataDir)
	case err != nil:
		return Committed{}, fmt.Errorf("coordinator: %w", err)
	case !st.IsDir():
		return Committed{}, fmt.Errorf("%w: %s is not a directory", ErrNoReplicaState, dataDir)
	}
	var errs error
	for range readAttempts {
		c, err := readCommittedOnce(dataDir, init)
		if err == nil || !errors.Is(err, errRaced) {
			return c, err
		}
		errs = err
		time.Sleep(50 * time.Millisecond)
	}
	return Committed{}, fmt.Errorf("%w: gave up after %d reads that raced with the running replica: %w", ErrInconsistentState, readAttempts, errs)
}

// errRaced marks a read that may have raced with the running replica and
// is worth retrying (the log store's own such reads included).
var errRaced = raftlog.ErrRaced

func readCommittedOnce(dataDir string, init InitFunc) (Committed, error) {
	// 1. The ledger first: everything it charged is in the snapshot or
	// still in the log (the replica keeps TrailingLogs entries after a
	// snapshot, and a snapshot is taken after the charges it covers).
	recs, lastCharge, err := readLedgerCharges(dataDir)
	if err != nil {
		return Committed{}, err
	}

	// 2. The newest snapshot that decodes, as Raft restores it.
	snapIndex, snap, err := readNewestSnapshot(dataDir)
	if err != nil {
		return Committed{}, err
	}

	// 3. The Raft log, read in place (raftlog.OpenReadOnly): the entries
	// up to the last charge are committed, so a running replica may
	// compact them (the open files stay readable) but never rewrites them.
	logs, err := raftlog.OpenReadOnly(filepath.Join(dataDir, "raft"))
	if errors.Is(err, raftlog.ErrNoLog) {
		return Committed{}, fmt.Errorf("%w: %w", ErrNoReplicaState, err)
	}
	if err != nil {
		return Committed{}, err
	}
	defer logs.Close()
	tmp, err := os.MkdirTemp("", "dpcluster-export-")
	if err != nil {
		return Committed{}, fmt.Errorf("coordinator: %w", err)
	}
	defer os.RemoveAll(tmp)

	// 4. Replay into a fresh state machine whose ledger lives in tmp.
	fsm, err := NewFSM(tmp, init, nil)
	if err != nil {
		return Committed{}, err
	}
	defer fsm.Close()
	if snap != nil {
		if err := fsm.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
			return Committed{}, err
		}
	}
	if err := replayCommitted(fsm, logs, snapIndex, lastCharge); err != nil {
		return Committed{}, err
	}

	// 5. Check the replay against the ledger: same records, same head.
	return checkedCommitted(fsm, recs)
}

// readLedgerCharges reads dataDir's ledger (readCommittedOnce's step 1):
// its records and the Raft index of its last charge or of its end record,
// whichever is later (the replay must reach the entry that ended the run,
// which wrote the end record). A ledger without a run record is
// ErrNoReplicaState.
func readLedgerCharges(dataDir string) ([]ledger.Record, uint64, error) {
	recs, _, err := ledger.ReadFile(filepath.Join(dataDir, LedgerFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("%w: %s has no %s", ErrNoReplicaState, dataDir, LedgerFile)
	}
	if err != nil {
		return nil, 0, err
	}
	var run *ledger.Record
	var lastCharge uint64
	for i := range recs {
		switch recs[i].Kind {
		case ledger.RecordRun:
			run = &recs[i]
		case ledger.RecordCharge, ledger.RecordEnd:
			lastCharge = max(lastCharge, recs[i].Index)
		}
	}
	if run == nil {
		return nil, 0, fmt.Errorf("%w: the ledger in %s has no run record (the run was never configured)", ErrNoReplicaState, dataDir)
	}
	return recs, lastCharge, nil
}

// replayCommitted applies to fsm, restored from the snapshot at snapIndex,
// the committed entries of logs (readCommittedOnce's step 4): those up to
// the ledger's last charge, the g̃ of that charge, and the configuration
// entry of a run not charged yet.
func replayCommitted(fsm *FSM, logs *raftlog.Store, snapIndex, lastCharge uint64) error {
	first, err := logs.FirstIndex()
	if err != nil {
		return err
	}
	last, err := logs.LastIndex()
	if err != nil {
		return err
	}
	upTo := max(lastCharge, snapIndex)
	for i := snapIndex + 1; i <= upTo; i++ {
		var e raft.Log
		if err := logs.GetLog(i, &e); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				return fmt.Errorf("%w: %w: the ledger charged Raft index %d, the log holds %d..%d after snapshot %d",
					errRaced, ErrInconsistentState, upTo, first, last, snapIndex)
			}
			return fmt.Errorf("coordinator: Raft log entry %d: %w", i, err)
		}
		if err := replayEntry(fsm, &e); err != nil {
			return err
		}
	}
	// The g̃ of the last charge, if it is in the log: the leader proposes
	// one g̃ per charge, once the charge is committed, and released the θ
	// it gives; applying it gives the state the replica reaches when it is
	// committed. (If it never is, the next leader charges that step again:
	// the θ read here was released and charged all the same.)
	if err := replayPendingGrad(fsm, logs, upTo, last); err != nil {
		return err
	}
	// A run configured but not charged yet: its configuration entry was
	// committed (the ledger's run record is written when it is applied).
	for i := upTo + 1; i <= last; i++ {
		if _, ok := fsm.Config(); ok {
			break
		}
		var e raft.Log
		if err := logs.GetLog(i, &e); err != nil {
			return fmt.Errorf("coordinator: Raft log entry %d: %w", i, err)
		}
		if e.Type != raft.LogCommand {
			continue
		}
		if t, _, err := decodeEntry(e.Data); err != nil || t != entryConfig {
			break
		}
		if err := replayEntry(fsm, &e); err != nil {
			return err
		}
	}
	return nil
}

// checkedCommitted returns fsm's state after the replay, checked against
// the ledger's records recs (readCommittedOnce's step 5): the replay must
// have configured the run and written the same records, up to the same
// head.
func checkedCommitted(fsm *FSM, recs []ledger.Record) (Committed, error) {
	cfg, ok := fsm.Config()
	if !ok {
		return Committed{}, fmt.Errorf("%w: %w: the ledger has a run record but neither the snapshot nor the log holds the configuration",
			errRaced, ErrInconsistentState)
	}
	head, seq := fsm.ledger.Head()
	if seq != uint64(len(recs)) || head.Hash != recs[len(recs)-1].Hash {
		return Committed{}, fmt.Errorf("%w: %w: replaying the log gave %d ledger records, the ledger holds %d",
			errRaced, ErrInconsistentState, seq, len(recs))
	}
	theta, step := fsm.Params(nil)
	digest, err := fsm.Digest()
	if err != nil {
		return Committed{}, err
	}
	s := fsm.State()
	return Committed{Config: cfg, Step: step, Theta: theta, Epsilon: s.Epsilon, Charges: s.Charges,
		Stopped: s.Stopped, Digest: digest}, nil
}

// Committed returns the state machine's applied state, read at once under
// its lock: what ReadCommitted reads from a data dir offline, without
// replaying the log (a replica's state machine holds only committed
// entries). The process that ran the replica (coordinator local) exports
// its model this way when the run ends. ErrNotConfigured before the run
// configuration is applied.
func (f *FSM) Committed() (Committed, error) {
	f.tmu.RLock()
	defer f.tmu.RUnlock()
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.cfg == nil {
		return Committed{}, ErrNotConfigured
	}
	digest, err := f.digestLocked()
	if err != nil {
		return Committed{}, err
	}
	return Committed{Config: *f.cfg, Step: f.applied, Charged: f.chargedStepLocked(), Theta: slices.Clone(f.theta), Epsilon: f.ledger.Spent(),
		Charges: f.ledger.Charges(), Stopped: f.stopped, Digest: digest}, nil
}

// LoggedRelease is a noisy gradient held in a replica's Raft log.
type LoggedRelease struct {
	Step  int64
	Index uint64 // the entry's Raft index
	Term  uint64
	// Charge is the Raft index of the charge it was released under: its
	// charge entry's for a grad entry; its own for a step entry (logs
	// written before the charge-ahead path, which charged and released in
	// one entry).
	Charge uint64
}

// LoggedReleases lists the noisy gradients (grad and step entries) that
// the Raft log under dataDir holds, oldest first, reading it in place
// (raftlog.OpenReadOnly: the replica may be running, or dead). An audit
// compares them with a ledger: every g̃ on a disk must have its charge
// (Charge) in the ledger of every replica that applied that far.
func LoggedReleases(dataDir string) ([]LoggedRelease, error) {
	var out []LoggedRelease
	err := eachLoggedRelease(dataDir, func(e *raft.Log, t entryType, body []byte) error {
		var h entryHeader
		if err := msgpack.Unmarshal(body, &h); err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrBadEntry, e.Index, err)
		}
		r := LoggedRelease{Step: h.Step, Index: e.Index, Term: e.Term, Charge: h.Charge}
		if t == entryStep {
			r.Charge = e.Index
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// errFound ends a walk of the log (eachCommand) that found what it sought.
var errFound = errors.New("found")

// replayPendingGrad replays, from the entries after upTo, the grad entry
// that names fsm's pending charge, if there is one.
func replayPendingGrad(fsm *FSM, logs *raftlog.Store, upTo, last uint64) error {
	st := fsm.State()
	if st.PendingIndex == 0 {
		return nil
	}
	var pending *raft.Log
	err := eachCommand(logs, upTo+1, last, func(e *raft.Log, t entryType, body []byte) error {
		var g entryHeader
		if t == entryGrad && msgpack.Unmarshal(body, &g) == nil && g.Charge == st.PendingIndex && g.Step == st.PendingStep {
			pending = e
			return errFound
		}
		return nil
	})
	if pending != nil {
		return replayEntry(fsm, pending)
	}
	return err
}

// replayEntry applies e to fsm as Raft would, failing on what makes a
// replica fail.
func replayEntry(fsm *FSM, e *raft.Log) error {
	if res, ok := fsm.Apply(e).(ApplyResult); ok && errors.Is(res.Err, ErrFatal) {
		return fmt.Errorf("coordinator: replaying Raft entry %d: %w", e.Index, res.Err)
	}
	return nil
}

// readNewestSnapshot returns the index and bytes of the newest snapshot in
// dataDir/snapshots that passes its checksum and decodes (nil and 0 if
// there is none), in the order Raft restores them: raftlog.ReadSnapshots,
// which lists them as the replica's store does and changes nothing.
func readNewestSnapshot(dataDir string) (uint64, []byte, error) {
	store, err := raftlog.ReadSnapshots(dataDir)
	if err != nil || store == nil {
		return 0, nil, err
	}
	metas, err := store.List()
	if err != nil {
		return 0, nil, fmt.Errorf("coordinator: %w", err)
	}
	var errs error
	for _, m := range metas {
		data, err := readSnapshotState(store, m.ID)
		if err == nil {
			_, err = decodeSnapshot(data)
		}
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("snapshot %s: %w", m.ID, err))
			continue
		}
		return m.Index, data, nil
	}
	if errs != nil {
		return 0, nil, fmt.Errorf("%w: no snapshot decodes: %w", errRaced, errs)
	}
	return 0, nil, nil
}

// readSnapshotState reads snapshot id's whole state, checksum checked.
func readSnapshotState(store *raftlog.SnapshotStore, id string) ([]byte, error) {
	_, rc, err := store.Open(id)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

package coordinator

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/raftlog"
)

// Reading a replica's ledger for an audit (ReadLedger).
//
// A ledger's records verify one by one, so a ledger cut at a record
// boundary, or one whose end record was lost, looks whole; a torn tail
// looks like a crash in an append. What the ledger must hold is in the
// data dir's Raft state: the state machine writes each record while it
// applies an entry, the same bytes on every replica and on every replay
// (FSM's doc comment). ReadLedger therefore replays the newest snapshot
// and every log entry after it through a fresh state machine whose ledger
// is a scratch file, and ledger.Contents.Audit requires the real ledger
// to hold every record the replay wrote.
//
// The replay's θ₀ is zero (zeroTheta), not the run's: the audit needs the
// ledger records, which depend on the entries (their events, steps and
// g̃), their Raft positions and the state machine's decisions to charge,
// apply or end, and none of those reads θ (the only check on an update is
// dpadam.CheckGradient, on g̃; a snapshot restores its own θ anyway).
//
// Read-only and safe beside a running replica: the ledger and the
// snapshots are read with os.Open, the log with raftlog.OpenReadOnly, and
// whether a replica runs is read from the kernel's lock table
// (raftlog.Held), taking no lock. The ledger is read first: a running
// replica writes a record only for an entry already in its log, so the
// Raft state read after it holds at least the ledger's records, and any
// more are entries the replica has not applied yet.

// LedgerRead is a replica's ledger as ReadLedger read it: its contents and
// what is known beside them (whether a replica runs on it, and its Raft
// state replayed). It changes nothing.
type LedgerRead struct {
	ledger.Contents
	Options ledger.AuditOptions
}

// Audit audits the ledger with what was read beside it
// (ledger.Contents.Audit).
func (r LedgerRead) Audit() ledger.AuditReport { return r.Contents.Audit(r.Options) }

// Damage says what is wrong with the ledger file beyond its records' own
// checks (ledger.Contents.Damage).
func (r LedgerRead) Damage() []string { return r.Contents.Damage(r.Options) }

// ReadLedger reads, without changing anything, the ledger at arg: a
// replica's data dir (its ledger is DIR/LedgerFile) or a ledger file. It
// says whether a replica runs on the ledger's dir now (it holds the dir's
// Raft log: raftlog.Held), and, for a data dir, replays the dir's Raft
// state (see above; ledger.RaftReplay says why not, if it cannot). A
// missing ledger is an error wrapping fs.ErrNotExist that names the path
// looked for; a damaged one is read up to the damage (Contents.Err).
func ReadLedger(arg string) (LedgerRead, error) {
	st, err := os.Stat(arg)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return LedgerRead{}, fmt.Errorf("no ledger at %s: %w", arg, fs.ErrNotExist)
		}
		return LedgerRead{}, err
	}
	path, dataDir := arg, ""
	if st.IsDir() {
		dataDir, path = arg, filepath.Join(arg, LedgerFile)
		if _, err := os.Stat(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return LedgerRead{}, fmt.Errorf("no ledger in data directory %s: %s %w", arg, path, fs.ErrNotExist)
			}
			return LedgerRead{}, err
		}
	}
	live, err := raftlog.Held(filepath.Join(filepath.Dir(path), "raft"))
	if err != nil {
		return LedgerRead{}, fmt.Errorf("coordinator: is a replica running on %s? %w", filepath.Dir(path), err)
	}
	var r LedgerRead
	for attempt := 1; ; attempt++ {
		r.Contents, err = ledger.ReadContents(path)
		if err != nil {
			return LedgerRead{}, err
		}
		r.Options = ledger.AuditOptions{Live: live}
		if dataDir == "" {
			return r, nil
		}
		replay, err := replayRaftState(dataDir)
		switch {
		case err == nil:
			r.Options.Raft = replay
			return r, nil
		case errors.Is(err, errRaced) && live && attempt < readAttempts:
			time.Sleep(50 * time.Millisecond) // the replica compacted its log meanwhile
		default:
			r.Options.Raft = &ledger.RaftReplay{Failed: err.Error()}
			return r, nil
		}
	}
}

// replayRaftState applies the Raft state of the replica data dir dataDir,
// its newest snapshot that decodes and every log entry after it, to a
// fresh state machine whose ledger is a scratch file in a temporary
// directory, and returns the records that ledger holds, the last step
// applied and why the run stopped. A dir without a Raft log it can read
// gives a replay whose Unavailable says why; an error means the Raft
// state is incomplete or an entry could not be applied (wrapping
// raftlog.ErrRaced for a read that may have raced with a running
// replica).
func replayRaftState(dataDir string) (*ledger.RaftReplay, error) {
	snapIndex, snap, err := readNewestSnapshot(dataDir)
	if err != nil {
		return nil, err
	}
	logs, err := raftlog.OpenReadOnly(filepath.Join(dataDir, "raft"))
	if errors.Is(err, raftlog.ErrNoLog) {
		return &ledger.RaftReplay{Unavailable: err.Error()}, nil
	}
	if err != nil {
		return nil, err
	}
	defer logs.Close()
	tmp, err := os.MkdirTemp("", "dpcluster-audit-")
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	defer os.RemoveAll(tmp)
	// The scratch ledger needs no fsync: it is read once and removed.
	fsm, err := NewFSM(tmp, zeroTheta, nil, ledger.WithSyncHook(func(*os.File) error { return nil }))
	if err != nil {
		return nil, err
	}
	defer fsm.Close()
	var snapRecords uint64
	if snap != nil {
		if err := fsm.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
			return nil, fmt.Errorf("coordinator: restoring snapshot at index %d: %w", snapIndex, err)
		}
		_, snapRecords = fsm.ledger.Head()
	}
	last, err := replayLog(fsm, logs, snapIndex)
	if err != nil {
		return nil, err
	}
	recs, _, err := ledger.ReadFile(filepath.Join(tmp, LedgerFile))
	if err != nil {
		return nil, err
	}
	st := fsm.State()
	return &ledger.RaftReplay{SnapshotIndex: snapIndex, LastIndex: last, SnapshotRecords: int(snapRecords), Records: recs,
		Applied: st.Applied, Stopped: st.Stopped}, nil
}

// replayLog applies to fsm, restored from the snapshot at snapIndex (0:
// none), every entry of logs after it, and returns the last index
// applied (snapIndex if none).
func replayLog(fsm *FSM, logs *raftlog.Store, snapIndex uint64) (uint64, error) {
	first, err := logs.FirstIndex()
	if err != nil {
		return 0, err
	}
	last, err := logs.LastIndex()
	if err != nil {
		return 0, err
	}
	if last <= snapIndex {
		return snapIndex, nil
	}
	if first > snapIndex+1 {
		return 0, fmt.Errorf("%w: %w: the Raft log holds entries %d–%d, the newest snapshot is at index %d: entries %d–%d are in neither",
			errRaced, ErrInconsistentState, first, last, snapIndex, snapIndex+1, first-1)
	}
	for i := snapIndex + 1; i <= last; i++ {
		var e raft.Log
		if err := logs.GetLog(i, &e); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				err = fmt.Errorf("%w: %w", errRaced, err)
			}
			return 0, fmt.Errorf("coordinator: Raft log entry %d: %w", i, err)
		}
		if err := replayEntry(fsm, &e); err != nil {
			return 0, err
		}
	}
	return last, nil
}

// zeroTheta is the InitFunc of a replay that needs the ledger, not θ (see
// the comment at the top of this file).
func zeroTheta(c RunConfig) ([]float32, error) { return make([]float32, c.Dim), nil }

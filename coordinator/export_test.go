package coordinator

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fileState is what the read-only check compares: every path under a dir
// with its size, mtime and mode.
type fileState struct {
	size  int64
	mtime time.Time
	mode  fs.FileMode
}

func dirState(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fileState{info.Size(), info.ModTime(), info.Mode()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadCommitted runs a real replica for a few steps and reads its data
// dir with ReadCommitted, once while the replica runs (it holds the Raft
// log's lock and appends to it) and once after it closed: both give the replica's own
// step, θ (bit for bit) and state digest. With 20 steps the state is a
// snapshot plus log entries replayed through the state machine; with 3,
// the log alone. The read leaves the data dir as it was: no file created,
// removed, resized or touched.
func TestReadCommitted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		steps    int
		snapshot bool
	}{{"log only", 3, false}, {"snapshot and log", 20, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := testRunConfig()
			grads := noisyGrads(tc.steps, 31)
			r := openTestReplica(t, dir, freeAddr(t))
			waitLeader(t, r)
			if tc.snapshot {
				runSteps(t, r, c, grads, 1, 10)
				if err := r.Snapshot(); err != nil {
					t.Fatal(err)
				}
				runSteps(t, r, c, grads, 11, tc.steps)
			} else {
				runSteps(t, r, c, grads, 1, tc.steps)
			}
			wantTheta, wantStep := r.FSM().Params(nil)
			wantDigest, err := r.FSM().Digest()
			if err != nil {
				t.Fatal(err)
			}
			check := func(when string) {
				t.Helper()
				got, err := ReadCommitted(dir, testInit)
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				if got.Step != wantStep || got.Step != int64(tc.steps) || !bitsEqual(got.Theta, wantTheta) || got.Digest != wantDigest {
					t.Errorf("%s: step %d digest %s, want step %d digest %s (θ equal: %v)", when, got.Step, got.Digest, wantStep, wantDigest, bitsEqual(got.Theta, wantTheta))
				}
				if got.Charges != uint64(tc.steps) || got.Config.Run != c.Run || !(got.Epsilon > 0) {
					t.Errorf("%s: %d charges, run %q, ε %v", when, got.Charges, got.Config.Run, got.Epsilon)
				}
			}
			check("while the replica runs")
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			snaps, _ := os.ReadDir(filepath.Join(dir, "snapshots"))
			if (len(snaps) > 0) != tc.snapshot {
				t.Fatalf("%d snapshots on disk, want some: %v", len(snaps), tc.snapshot)
			}
			before := dirState(t, dir)
			check("after the replica closed")
			after := dirState(t, dir)
			for p, b := range before {
				if a, ok := after[p]; !ok || a != b {
					t.Errorf("%s changed: %+v → %+v", p, b, a)
				}
			}
			for p := range after {
				if _, ok := before[p]; !ok {
					t.Errorf("%s created", p)
				}
			}
		})
	}
}

// TestReadCommittedRefusesNoState: a missing dir, an empty dir, a file and
// a dir whose ledger has no run are refused with ErrNoReplicaState, and
// nothing is created in them.
func TestReadCommittedRefusesNoState(t *testing.T) {
	base := t.TempDir()
	empty := filepath.Join(base, "empty")
	file := filepath.Join(base, "file")
	unconfigured := filepath.Join(base, "unconfigured")
	for _, d := range []string{empty, unconfigured} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := NewFSM(unconfigured, testInit, nil) // creates an empty ledger
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, dir := range []string{filepath.Join(base, "missing"), empty, file, unconfigured} {
		before := dirState(t, base)
		_, err := ReadCommitted(dir, testInit)
		if !errors.Is(err, ErrNoReplicaState) {
			t.Errorf("%s: %v, want ErrNoReplicaState", dir, err)
		}
		if after := dirState(t, base); len(after) != len(before) {
			t.Errorf("%s: reading it created files", dir)
		}
	}
}

// TestReadCommittedChecksLedger: a Raft log that lost entries the ledger
// charged (here: the log deleted, the snapshot kept) is refused with
// ErrInconsistentState, not exported as an older θ.
func TestReadCommittedChecksLedger(t *testing.T) {
	dir := t.TempDir()
	c := testRunConfig()
	grads := noisyGrads(12, 5)
	r := openTestReplica(t, dir, freeAddr(t))
	waitLeader(t, r)
	runSteps(t, r, c, grads, 1, 6)
	if err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	runSteps(t, r, c, grads, 7, 12)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "raft")
	if err := os.RemoveAll(logPath); err != nil {
		t.Fatal(err)
	}
	s := openTestLog(t, logPath) // an empty log
	s.Close()
	if _, err := ReadCommitted(dir, testInit); !errors.Is(err, ErrInconsistentState) {
		t.Fatalf("ReadCommitted = %v, want ErrInconsistentState", err)
	}
}

// TestReadCommittedAfterEnd: a run ended by a stop entry after step 3's
// charge, whose g̃ never came: ReadCommitted replays up to the entry that
// ended the run, which wrote the ledger's end record, and reads step 2,
// the stop reason and the three charges.
func TestReadCommittedAfterEnd(t *testing.T) {
	dir := t.TempDir()
	c := testRunConfig()
	grads := noisyGrads(2, 32)
	r := openTestReplica(t, dir, freeAddr(t))
	defer r.Close()
	waitLeader(t, r)
	runSteps(t, r, c, grads, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res, err := r.ProposeCharge(ctx, 3, c.Event(), "test"); err != nil || !res.Pending {
		t.Fatalf("step 3's charge: %+v, %v", res, err)
	}
	if err := r.ProposeStop(ctx, stopBudget); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCommitted(dir, testInit)
	if err != nil {
		t.Fatal(err)
	}
	if got.Step != 2 || got.Stopped != stopBudget || got.Charges != 3 {
		t.Errorf("read step %d, stopped %q, %d charges; want step 2, %q, 3", got.Step, got.Stopped, got.Charges, stopBudget)
	}
}

package coordinator

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/raftlog"
)

// testReplicaConfig is openTestReplica's configuration.
func testReplicaConfig(dir, addr string) ReplicaConfig {
	cfg := DefaultReplicaConfig()
	cfg.ID, cfg.RaftAddr, cfg.DataDir, cfg.Bootstrap = "r1", addr, dir, true
	cfg.SnapshotThreshold, cfg.TrailingLogs = 8, 4
	return cfg
}

// runSteps configures r with c (unless it is configured) and proposes
// steps from..to with grads[step-1], each of which must be applied.
func runSteps(t *testing.T, r *Replica, c RunConfig, grads [][]float32, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, ok := r.FSM().Config(); !ok {
		if err := r.Configure(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for s := from; s <= to; s++ {
		res, err := r.ProposeStep(ctx, int64(s), c.Event(), grads[s-1], "test")
		if err != nil || !res.Applied {
			t.Fatalf("step %d: %+v, %v", s, res, err)
		}
	}
}

// removeAllBut deletes every entry of dir except keep, as an operator
// "fixing" a broken data dir would.
func removeAllBut(t *testing.T, dir, keep string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == keep {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// startRefused opens a replica on dir and requires it to refuse with
// ledger.ErrHistoryMismatch, leaving the ledger's bytes as they were and
// writing no Raft state where there was none.
func startRefused(t *testing.T, dir, addr string) error {
	t.Helper()
	ledgerPath := filepath.Join(dir, LedgerFile)
	before, err := os.ReadFile(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	hadRaft := raftStateExists(t, dir)
	r, err := OpenReplica(testReplicaConfig(dir, addr), testInit)
	if err == nil {
		r.Close()
		t.Fatal("the replica started on a Raft state that does not hold its ledger's charges")
	}
	if !errors.Is(err, ledger.ErrHistoryMismatch) {
		t.Fatalf("OpenReplica = %v, want ledger.ErrHistoryMismatch", err)
	}
	if after, _ := os.ReadFile(ledgerPath); !bytes.Equal(before, after) {
		t.Error("the refused start changed the ledger")
	}
	if !hadRaft && raftStateExists(t, dir) {
		t.Error("the refused start bootstrapped a Raft state")
	}
	return err
}

// raftStateExists reports whether dir holds a Raft log with entries or a
// snapshot.
func raftStateExists(t *testing.T, dir string) bool {
	t.Helper()
	if snaps, _ := os.ReadDir(filepath.Join(dir, "snapshots")); len(snaps) > 0 {
		return true
	}
	if _, err := os.Stat(filepath.Join(dir, "raft")); err != nil {
		return false
	}
	s := openTestLog(t, filepath.Join(dir, "raft"))
	defer s.Close()
	last, err := s.LastIndex()
	return err != nil || last > 0
}

// TestReplicaRefusesWipedRaftState is issue 11 item 3 at the replica
// level: a replica ran 20 steps; everything in its data dir but the
// ledger is deleted; it is started again. Its new Raft history would
// reuse the indexes the ledger already charged, so before the fix the new
// history's first steps were applied but never charged (the test then
// found 20 charges after 30 releases). Now it refuses to start, with an
// error that says what happened and what to do, and changes nothing.
func TestReplicaRefusesWipedRaftState(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	c := testRunConfig()
	grads := noisyGrads(30, 21)
	r := openTestReplica(t, dir, addr)
	waitLeader(t, r)
	runSteps(t, r, c, grads, 1, 20)
	if err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	removeAllBut(t, dir, LedgerFile)

	err := startRefused(t, dir, addr)
	for _, want := range []string{"Raft state is empty", "20 charges", "restore", "new data directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Starting again is refused again: the refusal wrote nothing.
	startRefused(t, dir, addr)
}

// TestReplicaRefusesLostLogSuffix: the Raft log is deleted but a snapshot
// survives. Raft would restart from the snapshot (step 20) while the
// ledger holds charges up to step 30, and the re-proposed steps 21-30
// would get Raft indexes the ledger already charged (before the fix: 32
// charges after 40 releases).
func TestReplicaRefusesLostLogSuffix(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	c := testRunConfig()
	grads := noisyGrads(30, 22)
	r := openTestReplica(t, dir, addr)
	waitLeader(t, r)
	runSteps(t, r, c, grads, 1, 20)
	if err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	runSteps(t, r, c, grads, 21, 30)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "raft")); err != nil {
		t.Fatal(err)
	}
	if err := startRefused(t, dir, addr); !strings.Contains(err.Error(), "entries were lost") {
		t.Errorf("error %q does not say that log entries were lost", err)
	}
}

// TestReplicaRefusesLedgerOfAnotherHistory: the ledger of replica A is
// copied into the data dir of replica B, which ran longer (an operator
// restoring the wrong file). B's Raft state is of another history, with
// or without a snapshot holding the configuration; B refuses to start
// rather than take A's charges for its own or drop them.
func TestReplicaRefusesLedgerOfAnotherHistory(t *testing.T) {
	for _, snapshot := range []bool{false, true} {
		t.Run(map[bool]string{false: "log", true: "snapshot"}[snapshot], func(t *testing.T) {
			c := testRunConfig()
			grads := noisyGrads(20, 23)
			dirA, dirB, addr := t.TempDir(), t.TempDir(), freeAddr(t)
			a := openTestReplica(t, dirA, addr)
			waitLeader(t, a)
			runSteps(t, a, c, grads, 1, 5)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			b := openTestReplica(t, dirB, addr)
			waitLeader(t, b)
			runSteps(t, b, c, grads, 1, 20)
			if snapshot {
				if err := b.Snapshot(); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if !snapshot {
				// The configuration must come from the log: no snapshot.
				if snaps, _ := os.ReadDir(filepath.Join(dirB, "snapshots")); len(snaps) > 0 {
					if err := os.RemoveAll(filepath.Join(dirB, "snapshots")); err != nil {
						t.Fatal(err)
					}
				}
			}
			ledgerA, err := os.ReadFile(filepath.Join(dirA, LedgerFile))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dirB, LedgerFile), ledgerA, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := startRefused(t, dirB, addr); !strings.Contains(err.Error(), "asked to account for Raft history") {
				t.Errorf("error %q does not name the other history", err)
			}
		})
	}
}

// TestReplicaKeepsHistoryAcrossRestarts: restarts (with and without
// snapshots) and a re-proposed configuration stay in the history the
// first configuration entry started; every charge records it.
func TestReplicaKeepsHistoryAcrossRestarts(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	c := testRunConfig()
	grads := noisyGrads(30, 24)
	r := openTestReplica(t, dir, addr)
	waitLeader(t, r)
	runSteps(t, r, c, grads, 1, 10)
	h, _ := r.FSM().configuredHistory()
	if len(h) != 32 {
		t.Fatalf("history ID %q, want 32 hex digits", h)
	}
	if err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	runSteps(t, r, c, grads, 11, 20)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r = openTestReplica(t, dir, addr)
	waitLeader(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Configure(ctx, c); err != nil {
		t.Fatalf("re-proposed configuration: %v", err)
	}
	runSteps(t, r, c, grads, 21, 30)
	if h2, _ := r.FSM().configuredHistory(); h2 != h {
		t.Errorf("history %q after a restart, want %q", h2, h)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// The data dir's Raft state settles the applied steps.
	rep := auditDataDir(t, dir)
	if !rep.OK || rep.History != h || rep.Charges != 30 || rep.Applied != 30 || rep.Raft == nil || rep.Raft.Applied != 30 {
		t.Errorf("audit: %+v", rep)
	}
	recs, _, _ := ledger.ReadFile(filepath.Join(dir, LedgerFile))
	for _, rec := range recs {
		if rec.History != h {
			t.Fatalf("record %d has history %q, want %q", rec.Seq, rec.History, h)
		}
	}
}

// configLog is a configuration entry of history h.
func configLog(t *testing.T, index uint64, c RunConfig, h string) *raft.Log {
	t.Helper()
	return logEntry(t, index, entryConfig, configEntry{RunConfig: c, History: h})
}

// TestFSMHistoryBinding: the configuration entry binds the ledger to its
// history. A second configuration entry of another history is refused
// (not fatal, changes nothing); a ledger of another history makes the
// replica fail closed on the configuration entry and refuses a snapshot
// of another history instead of replacing the ledger.
func TestFSMHistoryBinding(t *testing.T) {
	const h1, h2 = "11111111111111111111111111111111", "22222222222222222222222222222222"
	c := testRunConfig()
	grads := noisyGrads(4, 25)
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	if res := mustApply(t, f, configLog(t, 2, c, h1)); res.Err != nil {
		t.Fatal(res.Err)
	}
	for i := range 3 {
		mustApply(t, f, stepLog(t, uint64(i+3), int64(i+1), c, grads[i]))
	}
	if res := mustApply(t, f, configLog(t, 6, c, h2)); !errors.Is(res.Err, ledger.ErrHistoryMismatch) || errors.Is(res.Err, ErrFatal) {
		t.Errorf("configuration entry of another history: %+v", res)
	}
	if res := mustApply(t, f, configLog(t, 7, c, h1)); res.Err != nil {
		t.Errorf("re-proposed configuration: %v", res.Err)
	}
	if res := mustApply(t, f, stepLog(t, 8, 4, c, grads[3])); !res.Applied || !res.Charged {
		t.Errorf("step after the refused configuration: %+v", res)
	}
	snap := persistSnapshot(t, f)
	f.Close()

	// The same ledger under a Raft log of another history.
	g := newTestFSM(t, dir)
	res := mustApply(t, g, configLog(t, 2, c, h2))
	if !errors.Is(res.Err, ErrFatal) || !errors.Is(res.Err, ledger.ErrHistoryMismatch) {
		t.Fatalf("configuration of another history over a bound ledger: %+v", res)
	}
	if res := mustApply(t, g, stepLog(t, 3, 1, c, grads[0])); res.Charged || res.Applied {
		t.Errorf("step after the mismatch: %+v", res)
	}

	// A snapshot of history h1 restored into a replica whose ledger is
	// bound to h2 (with charges the snapshot's ledger lacks).
	other := t.TempDir()
	o := newTestFSM(t, other)
	mustApply(t, o, configLog(t, 2, c, h2))
	mustApply(t, o, stepLog(t, 3, 1, c, grads[1]))
	before, _ := os.ReadFile(filepath.Join(other, LedgerFile))
	if err := o.Restore(readCloser{bytes.NewReader(snap)}); !errors.Is(err, ledger.ErrHistoryMismatch) {
		t.Errorf("Restore of another history's snapshot: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(other, LedgerFile)); !bytes.Equal(before, after) {
		t.Error("the refused Restore replaced the ledger")
	}
	if o.State().Fatal == nil {
		t.Error("the replica goes on after refusing a snapshot")
	}
	// Into a fresh replica it restores, and charges go on in h1.
	n := newTestFSM(t, t.TempDir())
	if err := n.Restore(readCloser{bytes.NewReader(snap)}); err != nil {
		t.Fatal(err)
	}
	if h, ok := n.configuredHistory(); !ok || h != h1 {
		t.Errorf("restored history %q, want %q", h, h1)
	}
	if res := mustApply(t, n, stepLog(t, 9, 5, c, grads[0])); !res.Applied || !res.Charged {
		t.Errorf("step after restore: %+v", res)
	}
}

// TestReplicaResumesBeforeHistoryIDs: a data dir written before history
// IDs (configuration entries that are a bare RunConfig, a ledger whose
// records carry no history) resumes as before: the Raft state's
// configuration has no ID and neither has the ledger. Wiping its Raft
// state is refused like any other.
func TestReplicaResumesBeforeHistoryIDs(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	c := testRunConfig()
	grads := noisyGrads(20, 26)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := openTestReplica(t, dir, addr)
	waitLeader(t, r)
	bare, err := encodeEntry(entryConfig, c) // what the previous leader proposed
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.propose(ctx, bare); err != nil || res.Err != nil {
		t.Fatalf("bare configuration entry: %+v, %v", res, err)
	}
	runSteps(t, r, c, grads, 1, 10)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r = openTestReplica(t, dir, addr)
	waitLeader(t, r)
	runSteps(t, r, c, grads, 11, 20)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	rep := auditDataDir(t, dir)
	if !rep.OK || rep.History != "" || rep.Applied != 20 {
		t.Errorf("audit: %+v", rep)
	}
	removeAllBut(t, dir, LedgerFile)
	startRefused(t, dir, addr)
}

// openTestLog opens the Raft log store at path for writing.
func openTestLog(t *testing.T, path string) *raftlog.Store {
	t.Helper()
	s, err := raftlog.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

package coordinator

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/ledger"
)

// countingSyncs is a ledger option that counts the ledger's fsyncs and
// fails them while *fail is set.
func countingSyncs(n *atomic.Int64, fail *atomic.Bool) ledger.Option {
	return ledger.WithSyncHook(func(fh *os.File) error {
		n.Add(1)
		if fail != nil && fail.Load() {
			return syscall.EIO
		}
		return fh.Sync()
	})
}

// backlog is the entries of a configured run's steps 1..n on the
// charge-ahead path (a charge and a grad entry each), from Raft index 2.
func backlog(t testing.TB, c RunConfig, grads [][]float32) []*raft.Log {
	var logs []*raft.Log
	for i, g := range grads {
		ci := uint64(2 + 2*i)
		logs = append(logs, chargeLog(t, ci, 1, int64(i+1), c), gradLog(t, ci+1, 1, int64(i+1), ci, g))
	}
	return logs
}

// TestFSMApplyBatchOneLedgerFsync: a batch of committed entries (what Raft
// hands a restarted replica catching up) costs the ledger one fsync, not
// one per charge, and ends in the same state, bit for bit, as the entries
// applied one at a time. Before ApplyBatch, Raft applied entries one at a
// time: 16 charges, 16 fsyncs.
func TestFSMApplyBatchOneLedgerFsync(t *testing.T) {
	c := testRunConfig()
	grads := noisyGrads(16, 11)
	logs := backlog(t, c, grads)

	var oneSyncs atomic.Int64
	one := newTestFSM(t, t.TempDir(), countingSyncs(&oneSyncs, nil))
	mustApply(t, one, logEntry(t, 1, entryConfig, c))
	oneStart := oneSyncs.Load()
	for _, l := range logs {
		if res := mustApply(t, one, l); res.Err != nil {
			t.Fatal(res.Err)
		}
	}

	var syncs atomic.Int64
	dir := t.TempDir()
	f := newTestFSM(t, dir, countingSyncs(&syncs, nil))
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	bf, ok := any(f).(raft.BatchingFSM)
	if !ok {
		t.Fatalf("the FSM is not a raft.BatchingFSM: Raft applies a backlog one entry at a time, %d ledger fsyncs for %d charges",
			oneSyncs.Load()-oneStart, len(grads))
	}
	start := syncs.Load()
	out := bf.ApplyBatch(logs)
	if len(out) != len(logs) {
		t.Fatalf("%d results for %d entries", len(out), len(logs))
	}
	for i, r := range out {
		ar, _ := r.(ApplyResult)
		if ar.Err != nil || (i%2 == 0 && !ar.Pending) || (i%2 == 1 && !ar.Applied) {
			t.Fatalf("entry %d: %+v", i, ar)
		}
	}
	if got := syncs.Load() - start; got != 1 {
		t.Errorf("a batch of %d charges took %d ledger fsyncs, want 1", len(grads), got)
	}
	if got := oneSyncs.Load() - oneStart; got != int64(len(grads)) {
		t.Errorf("one at a time: %d fsyncs for %d charges", got, len(grads))
	}
	d1, err1 := one.Digest()
	d2, err2 := f.Digest()
	if err1 != nil || err2 != nil || d1 != d2 {
		t.Errorf("digests differ: one at a time %s (%v), batched %s (%v)", d1, err1, d2, err2)
	}
	if s1, s2 := one.State(), f.State(); s1.Epsilon != s2.Epsilon || s2.Applied != 16 {
		t.Errorf("ε one at a time %v, batched %v; applied %d", s1.Epsilon, s2.Epsilon, s2.Applied)
	}
	// The ledger audited alone, without an end record: its last step
	// is unconfirmed (it may have been charged ahead of its g̃).
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 16 || rep.Applied != 15 || rep.Unconfirmed != 1 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

// TestFSMApplyBatchFailedFsyncFailsClosed: when the batch's one ledger
// fsync fails, every entry of the batch is answered with the replica's
// fatal error (the leader releases nothing of them), the replica stops
// applying and takes no snapshot, and the ledger file keeps only the
// charges made durable before the batch.
func TestFSMApplyBatchFailedFsyncFailsClosed(t *testing.T) {
	c := testRunConfig()
	grads := noisyGrads(6, 12)
	logs := backlog(t, c, grads)
	var syncs atomic.Int64
	var fail atomic.Bool
	dir := t.TempDir()
	f := newTestFSM(t, dir, countingSyncs(&syncs, &fail))
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	for _, l := range logs[:2] {
		mustApply(t, f, l)
	}
	fail.Store(true)
	bf, ok := any(f).(raft.BatchingFSM)
	if !ok {
		t.Fatal("the FSM is not a raft.BatchingFSM")
	}
	out := bf.ApplyBatch(logs[2:])
	for i, r := range out {
		ar, _ := r.(ApplyResult)
		if !errors.Is(ar.Err, ErrFatal) || !errors.Is(ar.Err, ledger.ErrBroken) || ar.Applied || ar.Pending {
			t.Errorf("entry %d of the failed batch: %+v", i, ar)
		}
	}
	fail.Store(false)
	if st := f.State(); st.Fatal == nil {
		t.Error("State().Fatal is nil after the failed fsync")
	}
	if res := mustApply(t, f, chargeLog(t, 20, 1, 7, c)); !errors.Is(res.Err, ErrFatal) {
		t.Errorf("replica kept applying: %+v", res)
	}
	if _, err := f.Snapshot(); err == nil {
		t.Error("a failed replica took a snapshot")
	}
	f.Close()
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 1 {
		t.Errorf("audit after the failed batch: %+v, %v (want the one durable charge)", rep, err)
	}
}

// TestReplicaReplaysBacklogInBatches: a replica restarted with a ledger
// behind its Raft log (what a crash with a batch's records still held
// leaves) charges the missing steps again as Raft replays them, through
// real Raft and durable stores, at fewer ledger fsyncs than charges; the
// run's θ and ledger are those of the uninterrupted run.
func TestReplicaReplaysBacklogInBatches(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	c := testRunConfig()
	grads := noisyGrads(24, 13)
	r, ctx := startConfigured(t, dir, addr, c)
	step := func(i int) {
		if res, err := r.ProposeStep(ctx, int64(i+1), c.Event(), grads[i], "test"); err != nil || !res.Applied {
			t.Fatalf("step %d: %+v, %v", i+1, res, err)
		}
	}
	for i := range 4 {
		step(i)
	}
	if err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, LedgerFile)
	early, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 4; i < len(grads); i++ {
		step(i)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, early, 0o644); err != nil { // the ledger as of step 4
		t.Fatal(err)
	}

	var syncs atomic.Int64
	r = openTestReplica(t, dir, addr, countingSyncs(&syncs, nil))
	defer r.Close()
	waitLeader(t, r)
	if s := r.FSM().State(); s.Applied != int64(len(grads)) {
		t.Fatalf("after restart: applied %d, want %d", s.Applied, len(grads))
	}
	if n := syncs.Load(); n >= int64(len(grads)-4) {
		t.Errorf("replaying %d charges took %d ledger fsyncs: not batched", len(grads)-4, n)
	}
	got, at := r.FSM().Params(nil)
	if at != int64(len(grads)) || !bitsEqual(got, reference(t, c, grads)) {
		t.Errorf("θ after the replay differs from the uninterrupted run (step %d)", at)
	}
	// The ledger audited alone, without an end record: its last step
	// is unconfirmed (it may have been charged ahead of its g̃).
	rep, err := ledger.Audit(path)
	if err != nil || !rep.OK || rep.Charges != len(grads) || rep.Applied != len(grads)-1 || rep.Unconfirmed != 1 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
	t.Logf("%d charges replayed with %d ledger fsyncs", len(grads)-4, syncs.Load())
}

// BenchmarkFSMBacklog applies a restarted replica's backlog of 32 steps
// (64 entries: charge and grad) one entry at a time, as Raft did before
// ApplyBatch, and as one batch of 64 (Raft's MaxAppendEntries), with real
// fsyncs on the test's temporary directory.
func BenchmarkFSMBacklog(b *testing.B) {
	c := testRunConfig()
	logs := backlog(b, c, noisyGrads(32, 14))
	for _, mode := range []string{"one-at-a-time", "batch"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				f, err := NewFSM(b.TempDir(), testInit, nil)
				if err != nil {
					b.Fatal(err)
				}
				if res, _ := f.Apply(logEntry(b, 1, entryConfig, c)).(ApplyResult); res.Err != nil {
					b.Fatal(res.Err)
				}
				b.StartTimer()
				if mode == "batch" {
					f.ApplyBatch(logs)
				} else {
					for _, l := range logs {
						f.Apply(l)
					}
				}
				b.StopTimer()
				if s := f.State(); s.Applied != 32 {
					b.Fatalf("applied %d", s.Applied)
				}
				f.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/32/1000, "ms/step")
		})
	}
}

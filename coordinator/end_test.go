package coordinator

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/ledger"
)

// TestFSMBudgetEndsAfterLostGrad: step 2's charge committed in term 1 and
// its g̃ was lost with the leader; the budget (two charges) then ends the
// run in term 2, by refusing the recharge of step 2 or by the new leader's
// stop entry. The run stops after step 1, and the ledger says so: its end
// record states step 1, and the audit counts 1 applied step and 1 charged
// and never applied, with both charges' ε.
func TestFSMBudgetEndsAfterLostGrad(t *testing.T) {
	c := testRunConfig()
	eps2, _, _ := accounting.RDP{}.EpsilonOrder(c.Event(), 2, c.Delta)
	c.TargetEpsilon = eps2 * (1 + 1e-9)
	g := noisyGrads(1, 5)
	for _, tc := range []struct {
		name string
		end  func(t *testing.T) *raft.Log
	}{
		{"recharge refused", func(t *testing.T) *raft.Log { return chargeLog(t, 6, 2, 2, c) }},
		{"stop entry", func(t *testing.T) *raft.Log {
			l := logEntry(t, 6, entryStop, stopEntry{Reason: stopBudget})
			l.Term = 2
			return l
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := newTestFSM(t, dir)
			mustApply(t, f, logEntry(t, 1, entryConfig, c))
			mustApply(t, f, chargeLog(t, 2, 1, 1, c))
			mustApply(t, f, gradLog(t, 3, 1, 1, 2, g[0]))
			mustApply(t, f, chargeLog(t, 4, 1, 2, c)) // its g̃ is lost with the leader
			spent := f.State().Epsilon
			if res := mustApply(t, f, tc.end(t)); res.Pending || res.Applied || res.Charged {
				t.Fatalf("the entry that ended the run: %+v", res)
			}
			if st := f.State(); st.Stopped != stopBudget || st.Applied != 1 || st.Charges != 2 || st.PendingIndex != 0 {
				t.Fatalf("state: %+v", st)
			}
			rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
			if err != nil || !rep.OK || rep.Applied != 1 || rep.Unapplied != 1 || rep.Charges != 2 ||
				!rep.Ended || rep.EndStep != 1 || rep.EndReason != stopBudget || rep.RecordedEpsilon != spent {
				t.Errorf("audit: %+v, %v", rep, err)
			}
		})
	}
}

// TestFSMEndRecordedOnce: two replicas applying the same log to the max
// steps write byte-identical ledgers ending in one end record (step 3,
// "max steps reached", at the last grad entry's position); a replica that
// restarts with no snapshot and replays the whole log writes nothing more.
func TestFSMEndRecordedOnce(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 3
	g := noisyGrads(4, 6)
	logs := []*raft.Log{logEntry(t, 1, entryConfig, c)}
	for i := range 3 {
		idx := uint64(2 + 2*i)
		logs = append(logs, chargeLog(t, idx, 1, int64(i+1), c), gradLog(t, idx+1, 1, int64(i+1), idx, g[i]))
	}
	logs = append(logs, logEntry(t, 8, entryStop, stopEntry{Reason: "late"}), chargeLog(t, 9, 1, 4, c))
	apply := func(dir string) {
		f := newTestFSM(t, dir)
		for _, l := range logs {
			mustApply(t, f, l)
		}
		if st := f.State(); st.Stopped != stopMaxSteps || st.Applied != 3 {
			t.Errorf("state: %+v", st)
		}
		f.Close()
	}
	a, b := t.TempDir(), t.TempDir()
	apply(a)
	apply(b)
	la, _ := os.ReadFile(filepath.Join(a, LedgerFile))
	lb, _ := os.ReadFile(filepath.Join(b, LedgerFile))
	if len(la) == 0 || !bytes.Equal(la, lb) {
		t.Fatalf("replicas' ledgers differ: %d and %d bytes", len(la), len(lb))
	}
	apply(a) // restarted with no snapshot: Raft replays the whole log
	again, _ := os.ReadFile(filepath.Join(a, LedgerFile))
	if !bytes.Equal(again, la) {
		t.Errorf("replaying the log changed the ledger: %d bytes, was %d", len(again), len(la))
	}
	recs, _, err := ledger.ReadFile(filepath.Join(a, LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	var ends []ledger.Record
	for _, r := range recs {
		if r.Kind == ledger.RecordEnd {
			ends = append(ends, r)
		}
	}
	if len(ends) != 1 || ends[0].Step != 3 || ends[0].Reason != stopMaxSteps || ends[0].Index != 7 || ends[0].Term != 1 {
		t.Errorf("end records: %+v", ends)
	}
	// The charge after the end (index 9) is charged, as a replay.
	rep, err := ledger.Audit(filepath.Join(a, LedgerFile))
	if err != nil || !rep.OK || rep.Applied != 3 || rep.Replays != 1 || rep.Unapplied != 0 || rep.EndStep != 3 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

// TestFSMSnapshotAfterEnd: a replica that installs a snapshot taken after
// the end gets the end record with the ledger prefix, and its ledger is
// byte-identical to the one the snapshot was taken from.
func TestFSMSnapshotAfterEnd(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 1
	g := noisyGrads(1, 7)
	src := t.TempDir()
	f := newTestFSM(t, src)
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	mustApply(t, f, chargeLog(t, 2, 1, 1, c))
	mustApply(t, f, gradLog(t, 3, 1, 1, 2, g[0]))
	snap := persistSnapshot(t, f)
	dst := t.TempDir()
	r := newTestFSM(t, dst)
	if err := r.Restore(readCloser{bytes.NewReader(snap)}); err != nil {
		t.Fatal(err)
	}
	ls, _ := os.ReadFile(filepath.Join(src, LedgerFile))
	ld, _ := os.ReadFile(filepath.Join(dst, LedgerFile))
	if !bytes.Equal(ls, ld) {
		t.Fatalf("restored ledger differs: %d bytes, the source's %d", len(ld), len(ls))
	}
	if rep, _ := ledger.Audit(filepath.Join(dst, LedgerFile)); !rep.OK || !rep.Ended || rep.EndStep != 1 || rep.Applied != 1 {
		t.Errorf("audit of the restored ledger: %+v", rep)
	}
}

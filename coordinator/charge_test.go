package coordinator

import (
	"bytes"
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/ledger"
)

// chargeLog and gradLog are the charge-ahead path's two entries as Raft
// delivers them.
func chargeLog(t testing.TB, index, term uint64, step int64, c RunConfig) *raft.Log {
	t.Helper()
	l := logEntry(t, index, entryCharge, chargeEntry{Step: step, Event: c.Event(), Round: "r"})
	l.Term = term
	return l
}

func gradLog(t testing.TB, index, term uint64, step int64, charge uint64, g []float32) *raft.Log {
	t.Helper()
	data, err := encodeGradEntry(step, charge, g)
	if err != nil {
		t.Fatal(err)
	}
	return &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: data}
}

// TestFSMChargeThenGrad: each step's charge entry is charged (and becomes
// the pending charge) without moving θ; its grad entry then applies g̃.
// θ equals the optimizer run directly, and the ledger audits clean.
func TestFSMChargeThenGrad(t *testing.T) {
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	c := testRunConfig()
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	grads := noisyGrads(6, 3)
	idx := uint64(2)
	for i, g := range grads {
		step := int64(i + 1)
		res := mustApply(t, f, chargeLog(t, idx, 1, step, c))
		if res.Err != nil || !res.Charged || !res.Pending || res.Applied || res.Index != idx {
			t.Fatalf("step %d's charge: %+v", step, res)
		}
		if st := f.State(); st.Applied != step-1 || st.PendingStep != step || st.PendingIndex != idx || st.Charges != uint64(step) {
			t.Fatalf("after step %d's charge: %+v", step, st)
		}
		res = mustApply(t, f, gradLog(t, idx+1, 1, step, idx, g))
		if res.Err != nil || !res.Applied || res.Charged {
			t.Fatalf("step %d's g̃: %+v", step, res)
		}
		idx += 2
	}
	got, step := f.Params(nil)
	if step != 6 || !bitsEqual(got, reference(t, c, grads)) {
		t.Errorf("θ after 6 steps differs from the optimizer run directly (step %d)", step)
	}
	if st := f.State(); st.PendingIndex != 0 || st.Stopped != "" {
		t.Errorf("state: %+v", st)
	}
	// The ledger audited alone, without an end record: its last step
	// is unconfirmed (it may have been charged ahead of its g̃).
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 6 || rep.Applied != 5 || rep.Unconfirmed != 1 || rep.Recharges != 0 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

// TestFSMRechargeAfterLostGrad: a leader's charge for step 2 committed and
// its g̃ never did (it died); the next term's leader charges step 2 again.
// The second charge is pending, both are in the ledger (a recharge), and
// only the g̃ naming the second is applied.
func TestFSMRechargeAfterLostGrad(t *testing.T) {
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	c := testRunConfig()
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	g := noisyGrads(3, 4)
	mustApply(t, f, chargeLog(t, 2, 1, 1, c))
	mustApply(t, f, gradLog(t, 3, 1, 1, 2, g[0]))
	mustApply(t, f, chargeLog(t, 4, 1, 2, c)) // its g̃ is lost with the leader
	res := mustApply(t, f, chargeLog(t, 6, 2, 2, c))
	if res.Err != nil || !res.Charged || !res.Pending {
		t.Fatalf("step 2 charged again: %+v", res)
	}
	if st := f.State(); st.PendingIndex != 6 || st.Charges != 3 || st.Applied != 1 {
		t.Fatalf("state: %+v", st)
	}
	if res := mustApply(t, f, gradLog(t, 7, 2, 2, 6, g[1])); !res.Applied {
		t.Fatalf("g̃ of the second charge: %+v", res)
	}
	got, _ := f.Params(nil)
	if !bitsEqual(got, reference(t, c, g[:2])) {
		t.Error("θ differs from the optimizer run over the applied g̃")
	}
	// The ledger audited alone, without an end record: its last step
	// is unconfirmed (it may have been charged ahead of its g̃).
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 3 || rep.Recharges != 1 || rep.Applied != 1 || rep.Unconfirmed != 1 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

// TestFSMRefusesUnmatchedGrad: a grad entry that names no pending charge
// (none at all, an earlier charge, or the right charge with another step)
// or carries a g̃ the optimizer refuses is not applied, charges nothing,
// and stops the run: an honest leader proposes g̃ only for its own pending
// charge. Every replica refuses it alike (not fatal).
func TestFSMRefusesUnmatchedGrad(t *testing.T) {
	c := testRunConfig()
	g := noisyGrads(2, 5)
	bad := append([]float32(nil), g[1]...)
	bad[3] = float32(math.Inf(1))
	for _, tc := range []struct {
		name  string
		setup func(f *FSM)
		grad  *raft.Log
		want  error
	}{
		{"no charge", func(f *FSM) {}, gradLog(t, 2, 1, 1, 1, g[0]), ErrUnmatchedGrad},
		{"superseded charge", func(f *FSM) {
			mustApply(t, f, chargeLog(t, 2, 1, 1, c))
			mustApply(t, f, chargeLog(t, 4, 2, 1, c))
		}, gradLog(t, 5, 2, 1, 2, g[0]), ErrUnmatchedGrad},
		{"other step", func(f *FSM) { mustApply(t, f, chargeLog(t, 2, 1, 1, c)) }, gradLog(t, 3, 1, 2, 2, g[0]), ErrUnmatchedGrad},
		{"non-finite", func(f *FSM) { mustApply(t, f, chargeLog(t, 2, 1, 1, c)) }, gradLog(t, 3, 1, 1, 2, bad), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFSM(t, t.TempDir())
			mustApply(t, f, logEntry(t, 1, entryConfig, c))
			tc.setup(f)
			before := f.State().Charges
			res := mustApply(t, f, tc.grad)
			if res.Applied || res.Charged || res.Err == nil || (tc.want != nil && !errors.Is(res.Err, tc.want)) || errors.Is(res.Err, ErrFatal) {
				t.Fatalf("grad entry: %+v, want refused with %v", res, tc.want)
			}
			st := f.State()
			if st.Applied != 0 || st.Charges != before || st.Stopped == "" || st.Fatal != nil {
				t.Errorf("state after the refusal: %+v", st)
			}
		})
	}
}

// TestFSMChargeOverBudget: a charge the budget refuses is not pending, and
// the run stops; no g̃ can be applied after it.
func TestFSMChargeOverBudget(t *testing.T) {
	c := testRunConfig()
	c.TargetEpsilon = 0.05 // below one step's ε
	f := newTestFSM(t, t.TempDir())
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	res := mustApply(t, f, chargeLog(t, 2, 1, 1, c))
	if !errors.Is(res.Err, ledger.ErrBudgetExceeded) || res.Pending || res.Charged {
		t.Fatalf("charge over budget: %+v", res)
	}
	if st := f.State(); st.Stopped != stopBudget || st.PendingIndex != 0 || st.Charges != 0 {
		t.Fatalf("state: %+v", st)
	}
	if res := mustApply(t, f, gradLog(t, 3, 1, 1, 2, noisyGrads(1, 6)[0])); res.Applied {
		t.Fatalf("g̃ applied after a refused charge: %+v", res)
	}
}

// TestFSMSnapshotBetweenChargeAndGrad: a snapshot taken after a charge
// and before its g̃ carries the pending charge, so a replica restored from
// it applies that g̃ like the others and ends bit-identical.
func TestFSMSnapshotBetweenChargeAndGrad(t *testing.T) {
	c := testRunConfig()
	g := noisyGrads(3, 7)
	a := newTestFSM(t, t.TempDir())
	mustApply(t, a, logEntry(t, 1, entryConfig, c))
	mustApply(t, a, chargeLog(t, 2, 1, 1, c))
	mustApply(t, a, gradLog(t, 3, 1, 1, 2, g[0]))
	mustApply(t, a, chargeLog(t, 4, 1, 2, c))
	b := newTestFSM(t, t.TempDir())
	if err := b.Restore(readCloser{bytes.NewReader(persistSnapshot(t, a))}); err != nil {
		t.Fatal(err)
	}
	if st := b.State(); st.PendingIndex != 4 || st.PendingStep != 2 || st.Applied != 1 {
		t.Fatalf("restored state: %+v", st)
	}
	for _, f := range []*FSM{a, b} {
		if res := mustApply(t, f, gradLog(t, 5, 1, 2, 4, g[1])); !res.Applied {
			t.Fatalf("g̃ after the snapshot: %+v", res)
		}
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Error("the restored replica diverged")
	}
}

// persistSnapshot returns the bytes of a snapshot of f, as Raft would
// store them.
func persistSnapshot(t *testing.T, f *FSM) []byte {
	t.Helper()
	_, b := takeSnapshot(t, f)
	return b
}

// takeSnapshot takes f's snapshot and persists it, returning the snapshot
// (not released) and its bytes.
func takeSnapshot(t *testing.T, f *FSM) (*fsmSnapshot, []byte) {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	return snap.(*fsmSnapshot), sink.Bytes()
}

// TestFSMGradAfterStop: the end of the run is final. A stop entry between
// a charge and its g̃ (a leader never proposes one there: it proposes its
// stop after its last g̃, and a new leader's stop follows every entry of
// the old one it will ever commit) drops the pending charge: the g̃ after
// it is refused, θ stays at the step the end record states, and the step
// stays charged (its ε counts) and is counted as never applied.
func TestFSMGradAfterStop(t *testing.T) {
	c := testRunConfig()
	g := noisyGrads(1, 9)
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	mustApply(t, f, chargeLog(t, 2, 1, 1, c))
	mustApply(t, f, logEntry(t, 3, entryStop, stopEntry{Reason: "test"}))
	if res := mustApply(t, f, gradLog(t, 4, 1, 1, 2, g[0])); res.Applied || !errors.Is(res.Err, ErrUnmatchedGrad) {
		t.Fatalf("g̃ after the stop: %+v, want refused with ErrUnmatchedGrad", res)
	}
	if _, step := f.Params(nil); step != 0 {
		t.Errorf("θ at step %d after the end at step 0", step)
	}
	if st := f.State(); st.Stopped != "test" || st.Applied != 0 || st.Charges != 1 || st.Fatal != nil {
		t.Errorf("state: %+v", st)
	}
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.EndStep != 0 || rep.EndReason != "test" || rep.Applied != 0 || rep.Unapplied != 1 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

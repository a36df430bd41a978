package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// writeRunLedger writes a real run ledger at dir/ledger.log: a run admitted
// as adm (nil: to no budget) with charges charges of step, ended or not.
func writeRunLedger(t testing.TB, dir, run string, adm *Admission, step accounting.Event, charges int, ended bool) RunLedger {
	t.Helper()
	path := filepath.Join(dir, "ledger.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Hold()
	if err := l.StartRun(RunParams{Run: run, TargetEpsilon: 3, Delta: 1e-5, Noise: seed.Crypto, Mechanism: MechanismFloat,
		Accountant: AccountantRDP, History: "h-" + run, Admission: adm}); err != nil {
		t.Fatal(err)
	}
	for i := range charges {
		if _, err := l.Charge(int64(i+1), step, Position{History: "h-" + run, Term: 1, Index: uint64(i + 2)}, false); err != nil {
			t.Fatal(err)
		}
	}
	if ended {
		if _, err := l.End(int64(charges), "max steps reached", Position{History: "h-" + run, Term: 1, Index: uint64(charges + 2)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rl, err := ReadRunLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	return rl
}

// TestRebuildDatasetBudget: a budget rebuilt from its runs' ledgers keeps
// its ID, counts an ended run for its charges and a running one for its
// step limit, lets both resume and settle under their admissions, and
// CheckRuns finds it counts them all; a budget created afresh instead
// counts neither, and CheckRuns says so. Ledgers of two budgets, one
// admission twice, and a run with no admission are refused.
func TestRebuildDatasetBudget(t *testing.T) {
	step := accounting.SubsampledGaussian(0.01, 1.1)
	orig := t.TempDir()
	path, err := CreateDatasetBudget(orig, testDataset, "orig", 50, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenDatasetBudget(path)
	if err != nil {
		t.Fatal(err)
	}
	runs := t.TempDir()
	dirA, dirB := filepath.Join(runs, "a"), filepath.Join(runs, "b")
	for _, d := range []string{dirA, dirB} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	admA, err := b.Admit("a", RunLedger{Path: filepath.Join(dirA, "ledger.log")}, step, 500)
	if err != nil {
		t.Fatal(err)
	}
	admB, err := b.Admit("b", RunLedger{Path: filepath.Join(dirB, "ledger.log")}, step, 500)
	if err != nil {
		t.Fatal(err)
	}
	a := writeRunLedger(t, dirA, "a", &admA, step, 30, true)
	if _, err := b.Settle(admA.ID, a); err != nil {
		t.Fatal(err)
	}
	bl := writeRunLedger(t, dirB, "b", &admB, step, 7, false) // still running
	want := b.Spent()
	id := b.ID()
	b.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	rebuilt, err := RebuildDatasetBudget(dir, []RunLedger{a, bl})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := AuditDatasetBudget(rebuilt)
	if err != nil || !rep.OK || rep.BudgetID != id || len(rep.Runs) != 2 {
		t.Fatalf("rebuilt: %+v (%v)", rep, err)
	}
	limit, err := accounting.PLD{}.StepLimit(step, 3, 1e-5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Runs[0]; r.Open || r.Charges != 30 || r.Admission != admA.ID {
		t.Errorf("the ended run: %+v", r)
	}
	if r := rep.Runs[1]; !r.Open || r.Reserved != limit || r.Admission != admB.ID {
		t.Errorf("the running run: %+v, want open for its step limit %d", r, limit)
	}
	if rep.RecomputedEpsilon < want {
		t.Errorf("rebuilt ε %v below the lost budget's %v", rep.RecomputedEpsilon, want)
	}
	if n := CheckRuns(&rep, []RunLedger{a, bl}); n != 2 || !rep.OK {
		t.Errorf("CheckRuns: %d ledgers, problems %v", n, rep.Problems)
	}
	rb, err := OpenDatasetBudget(rebuilt)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rb.Admit("b", bl, step, 500); err != nil || got != admB {
		t.Errorf("the running run resumed under the rebuilt budget: %+v (%v)", got, err)
	}
	if _, err := rb.Settle(admA.ID, a); err != nil {
		t.Errorf("the ended run settles again: %v", err)
	}
	rb.Close()

	fresh, err := CreateDatasetBudget(t.TempDir(), testDataset, "fresh", 50, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	frep, err := AuditDatasetBudget(fresh)
	if err != nil {
		t.Fatal(err)
	}
	if CheckRuns(&frep, []RunLedger{a, bl}); frep.OK || len(frep.Problems) != 2 {
		t.Errorf("a fresh budget against the runs of the lost one: %v, want two problems", frep.Problems)
	}

	other := admA
	other.Budget = "another"
	c := writeRunLedger(t, t.TempDir(), "c", &other, step, 3, true)
	none := writeRunLedger(t, t.TempDir(), "d", nil, step, 3, true)
	idle := writeRunLedger(t, t.TempDir(), "e", &admB, step, 0, false)
	for name, rls := range map[string][]RunLedger{
		"two budgets": {a, c}, "one admission twice": {a, a}, "no admission": {none}, "running, no charge": {idle}, "none": nil,
	} {
		if _, err := RebuildDatasetBudget(t.TempDir(), rls); !errors.Is(err, ErrInvalidParameter) {
			t.Errorf("%s: %v, want ErrInvalidParameter", name, err)
		}
	}
	if _, err := RebuildDatasetBudget(dir, []RunLedger{a}); err == nil {
		t.Error("rebuild replaced an existing budget file")
	}
}

// FuzzReadRunRecord: any bytes as a ledger file either give a verified
// run record, nothing (ok false), or an error wrapping ErrCorrupt; never a
// panic, and never a record scan (ReadFile) would not give.
func FuzzReadRunRecord(f *testing.F) {
	adm := Admission{Dataset: testDataset, Budget: "b", ID: "i", File: "/f", Epsilon: 2, Delta: 1e-5}
	rl := writeRunLedger(f, f.TempDir(), "r", &adm, accounting.SubsampledGaussian(0.01, 1), 2, true)
	seed, err := os.ReadFile(rl.Path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:40])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, ok, err := readRunRecord(bytes.NewReader(raw))
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error is not ErrCorrupt: %v", err)
			}
			return
		}
		recs, _, rerr := scan(bytes.NewReader(raw))
		if ok && (rerr != nil && len(recs) == 0 || len(recs) > 0 && recs[0].Hash != r.Hash) {
			t.Fatalf("ReadRunRecord gave %+v, ReadFile %d records (%v)", r, len(recs), rerr)
		}
	})
}

// TestReadRunRecord: the first record of a real ledger, read alone, is its
// run record with its admission; a flipped byte in it is ErrCorrupt; a
// missing or empty file has none.
func TestReadRunRecord(t *testing.T) {
	adm := Admission{Dataset: testDataset, Budget: "b", ID: "i", File: "/f", Epsilon: 2, Delta: 1e-5}
	rl := writeRunLedger(t, t.TempDir(), "r", &adm, accounting.SubsampledGaussian(0.01, 1), 3, true)
	r, ok, err := ReadRunRecord(rl.Path)
	if a, aok := r.DatasetAdmission(); err != nil || !ok || r.Hash != rl.Hashes[0] || !aok || a != adm {
		t.Fatalf("ReadRunRecord: %+v %v %v", r, ok, err)
	}
	raw, err := os.ReadFile(rl.Path)
	if err != nil {
		t.Fatal(err)
	}
	raw[20] ^= 1
	bad := filepath.Join(t.TempDir(), "ledger.log")
	if err := os.WriteFile(bad, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadRunRecord(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a flipped byte in the run record: %v, want ErrCorrupt", err)
	}
	empty := filepath.Join(t.TempDir(), "ledger.log")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{empty, filepath.Join(t.TempDir(), "none.log")} {
		if _, ok, err := ReadRunRecord(p); ok || err != nil {
			t.Errorf("%s: ok %v, err %v; want no run record and no error", p, ok, err)
		}
	}
}

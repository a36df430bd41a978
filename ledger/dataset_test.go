package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
)

const testDataset = "d1d2d3d4d5d6d7d8d9d0e1e2e3e4e5e6e7e8e9e0f1f2f3f4f5f6f7f8f9f0a1a2"

// TestDatasetBudget: two runs on one dataset compose by the PLD
// accountant. The first is admitted for its step limit and settles at the
// charges it made; a second whose plan, composed with the first's charges,
// would pass the lifetime ε is refused with nothing recorded and an error
// naming the dataset, the budget and the steps left; a smaller plan fits.
// The history reopens the same and audits clean; a byte flip fails it.
func TestDatasetBudget(t *testing.T) {
	const q, delta = 256.0 / 60000, 1e-5
	sigma, err := accounting.PLD{}.Calibrate(3, 1000, delta, func(s float64) accounting.Event { return accounting.SubsampledGaussian(q, s) })
	if err != nil {
		t.Fatal(err)
	}
	step := accounting.SubsampledGaussian(q, sigma)
	limit, err := accounting.PLD{}.StepLimit(step, 3, delta, 1000)
	if err != nil || limit < 1000 || limit > 1001 {
		t.Fatalf("step limit %d (%v), want the 1000 steps σ was calibrated for", limit, err)
	}
	two, err := accounting.PLD{}.Epsilon(accounting.SubsampledGaussian(q, sigma), 2*limit, delta)
	if err != nil {
		t.Fatal(err)
	}
	lifetime := (3 + two) / 2 // one run fits, two whole runs do not
	dir := t.TempDir()
	path, err := CreateDatasetBudget(dir, testDataset, "fashion-mnist train", lifetime, delta)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CreateDatasetBudget(dir, testDataset, "again", 100, delta); !errors.Is(err, ErrRunMismatch) {
		t.Errorf("second CreateDatasetBudget: %v, want ErrRunMismatch", err)
	}
	b, err := OpenDatasetBudget(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Admit("run-a", "/data/a/ledger.log", step, limit); err != nil {
		t.Fatalf("first run: %v", err)
	}
	if got, want := b.Spent(), mustPLD(t, q, sigma, limit); got != want {
		t.Errorf("after admitting run a: ε %v, want its whole reservation's %v", got, want)
	}
	// A resumed run already admitted for as much records nothing.
	_, n := b.file.Head()
	if _, err := b.Admit("run-a", "/data/a/ledger.log", step, limit); err != nil {
		t.Fatal(err)
	}
	if _, n2 := b.file.Head(); n2 != n {
		t.Errorf("re-admitting an open run recorded %d records", n2-n)
	}
	if _, err := b.Settle("run-a", "/data/a/ledger.log", 300, "head-a"); err != nil {
		t.Fatal(err)
	}
	if got, want := b.Spent(), mustPLD(t, q, sigma, 300); got != want {
		t.Errorf("after run a settled at 300: ε %v, want %v", got, want)
	}
	// Run b wants a whole plan: 300 + limit charges compose past the
	// lifetime ε? Only if it exceeds; take a plan that must.
	over := 2 * limit
	if e := mustPLD(t, q, sigma, 300+over); !(e > lifetime) {
		t.Fatalf("precondition: ε(%d) = %v within %v", 300+over, e, lifetime)
	}
	_, before := b.file.Head()
	_, err = b.Admit("run-b", "/data/b/ledger.log", step, over)
	if !errors.Is(err, ErrDatasetBudget) {
		t.Fatalf("run b: %v, want ErrDatasetBudget", err)
	}
	for _, want := range []string{`"fashion-mnist train"`, testDataset[:12], "lifetime budget of ε = ", "room for at most", `run "run-b"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if _, after := b.file.Head(); after != before {
		t.Errorf("the refusal recorded %d records", after-before)
	}
	// The room it names fits, one more does not.
	room, err := b.room(step)
	if err != nil {
		t.Fatal(err)
	}
	if e := mustPLD(t, q, sigma, 300+room); e > lifetime {
		t.Errorf("room %d: ε %v past %v", room, e, lifetime)
	}
	if e := mustPLD(t, q, sigma, 300+room+1); !(e > lifetime) {
		t.Errorf("room %d: one more step is still within: ε %v", room, e)
	}
	if _, err := b.Admit("run-c", "/data/c/ledger.log", step, room); err != nil {
		t.Fatalf("run c, within the room: %v", err)
	}
	spent := b.Spent()
	b.Close()

	b2, err := OpenDatasetBudget(path)
	if err != nil {
		t.Fatal(err)
	}
	if b2.Spent() != spent || len(b2.runs) != 2 || b2.Budget().TargetEpsilon != lifetime {
		t.Errorf("reopened: ε %v (want %v), %d runs, lifetime %v", b2.Spent(), spent, len(b2.runs), b2.Budget().TargetEpsilon)
	}
	b2.Close()
	rep, err := AuditDatasetBudget(path)
	if err != nil || !rep.OK || rep.RecomputedEpsilon != spent || len(rep.Runs) != 2 || rep.Runs[0].Open || !rep.Runs[1].Open {
		t.Fatalf("audit: %+v, %v", rep, err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []int{len(raw) / 3, len(raw) - 20} {
		flipped := append([]byte(nil), raw...)
		flipped[at] ^= 0x01
		bad := filepath.Join(t.TempDir(), "flipped.budget")
		if err := os.WriteFile(bad, flipped, 0o644); err != nil {
			t.Fatal(err)
		}
		if rep, err := AuditDatasetBudget(bad); err != nil || rep.OK {
			t.Errorf("byte %d flipped: audit OK %v (%v)", at, rep.OK, err)
		}
	}
}

func mustPLD(t *testing.T, q, sigma float64, n int64) float64 {
	t.Helper()
	e, err := accounting.PLD{}.Epsilon(accounting.SubsampledGaussian(q, sigma), n, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// FuzzReadDatasetBudget: any bytes either decode into records that a
// dataset budget replays or is refused with ErrCorrupt, never a panic or
// another error.
func FuzzReadDatasetBudget(f *testing.F) {
	dir := f.TempDir()
	path, err := CreateDatasetBudget(dir, testDataset, "seed", 5, 1e-5)
	if err != nil {
		f.Fatal(err)
	}
	b, err := OpenDatasetBudget(path)
	if err != nil {
		f.Fatal(err)
	}
	step := accounting.SubsampledGaussian(0.01, 1)
	if _, err := b.Admit("r", "/l", step, 10); err != nil {
		f.Fatal(err)
	}
	if _, err := b.Settle("r", "/l", 4, "h"); err != nil {
		f.Fatal(err)
	}
	b.Close()
	seed, _ := os.ReadFile(path)
	f.Add(seed)
	f.Add(seed[:len(seed)-5])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		recs, _, err := scan(bytes.NewReader(raw))
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("scan error is not ErrCorrupt: %v", err)
			}
			return
		}
		if err := (&DatasetBudget{}).replay(recs); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("replay error is not ErrCorrupt: %v", err)
		}
	})
}

// TestDatasetBudgetResume: a settled run that resumes is admitted again
// for its whole reservation (its ledger may charge up to it, its earlier
// charges included), counts for it until it settles again, and the
// history replays and audits the same.
func TestDatasetBudgetResume(t *testing.T) {
	step := accounting.SubsampledGaussian(0.01, 1.1)
	path, err := CreateDatasetBudget(t.TempDir(), testDataset, "resume", 50, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenDatasetBudget(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pld := func(n int64) float64 {
		e, err := accounting.PLD{}.Epsilon(step, n, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for _, s := range []struct {
		admit, settle int64
	}{{500, 120}, {500, 300}} {
		if _, err := b.Admit("r", "/l", step, s.admit); err != nil {
			t.Fatal(err)
		}
		if got := b.Spent(); got != pld(s.admit) {
			t.Errorf("admitted for %d: ε %v, want %v", s.admit, got, pld(s.admit))
		}
		if _, err := b.Settle("r", "/l", s.settle, "h"); err != nil {
			t.Fatal(err)
		}
		if got := b.Spent(); got != pld(s.settle) {
			t.Errorf("settled at %d: ε %v, want %v", s.settle, got, pld(s.settle))
		}
	}
	if _, err := b.Settle("r", "/l", 200, "h"); err == nil {
		t.Error("settling fewer charges than before was accepted")
	}
	rep, err := AuditDatasetBudget(path)
	if err != nil || !rep.OK || rep.RecomputedEpsilon != pld(300) || len(rep.Runs) != 1 || rep.Runs[0].Charges != 300 {
		t.Errorf("audit: %+v (%v)", rep, err)
	}
}

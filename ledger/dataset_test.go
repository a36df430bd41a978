package ledger

import (
	"bytes"
	"errors"
	"fmt"
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
	a, err := b.Admit("run-a", RunLedger{Path: "/data/a/ledger.log"}, step, limit)
	if err != nil {
		t.Fatalf("first run: %v", err)
	}
	if got, want := b.Spent(), mustPLD(t, q, sigma, limit); got != want {
		t.Errorf("after admitting run a: ε %v, want its whole reservation's %v", got, want)
	}
	// A resumed run already admitted for as much records nothing.
	_, n := b.file.Head()
	if _, err := b.Admit("run-a", fakeLedger("/data/a/ledger.log", "run-a", a, 0), step, limit); err != nil {
		t.Fatal(err)
	}
	if _, n2 := b.file.Head(); n2 != n {
		t.Errorf("re-admitting an open run recorded %d records", n2-n)
	}
	if _, err := b.Settle(a.ID, fakeLedger("/data/a/ledger.log", "run-a", a, 300)); err != nil {
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
	_, err = b.Admit("run-b", RunLedger{Path: "/data/b/ledger.log"}, step, over)
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
	if _, err := b.Admit("run-c", RunLedger{Path: "/data/c/ledger.log"}, step, room); err != nil {
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
	a, err := b.Admit("r", RunLedger{Path: "/l"}, step, 10)
	if err != nil {
		f.Fatal(err)
	}
	if _, err := b.Settle(a.ID, fakeLedger("/l", "r", a, 4)); err != nil {
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
	var a Admission
	for i, s := range []struct {
		admit, settle int64
	}{{500, 120}, {500, 300}} {
		rl := RunLedger{Path: "/l"}
		if i > 0 {
			rl = fakeLedger("/l", "r", a, 120)
		}
		got, err := b.Admit("r", rl, step, s.admit)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && got != a {
			t.Errorf("resumed under admission %+v, want its own %+v", got, a)
		}
		a = got
		if got := b.Spent(); got != pld(s.admit) {
			t.Errorf("admitted for %d: ε %v, want %v", s.admit, got, pld(s.admit))
		}
		if _, err := b.Settle(a.ID, fakeLedger("/l", "r", a, s.settle)); err != nil {
			t.Fatal(err)
		}
		if got := b.Spent(); got != pld(s.settle) {
			t.Errorf("settled at %d: ε %v, want %v", s.settle, got, pld(s.settle))
		}
	}
	if _, err := b.Settle(a.ID, fakeLedger("/l", "r", a, 200)); err == nil {
		t.Error("settling fewer charges than before was accepted")
	}
	rep, err := AuditDatasetBudget(path)
	if err != nil || !rep.OK || rep.RecomputedEpsilon != pld(300) || len(rep.Runs) != 1 || rep.Runs[0].Charges != 300 {
		t.Errorf("audit: %+v (%v)", rep, err)
	}
}

// fakeLedger is the RunLedger of a run admitted as a that has made charges
// charges: a run record naming a, then one record per charge, whose hashes
// depend on the admission and the position only, so the ledger with more
// charges extends the one with fewer.
func fakeLedger(path, run string, a Admission, charges int64) RunLedger {
	rec := Record{Kind: RecordRun, Run: run, History: "history-" + a.ID, Dataset: a.Dataset, BudgetID: a.Budget, AdmissionID: a.ID,
		BudgetFile: a.File, BudgetEpsilon: a.Epsilon, BudgetDelta: a.Delta}
	rl := RunLedger{Path: path, Run: &rec, Charges: charges, Hashes: []string{"run-" + a.ID}}
	for i := range charges {
		rl.Hashes = append(rl.Hashes, fmt.Sprintf("%s-%d", a.ID, i+1))
	}
	return rl
}

// TestDatasetBudgetBindsRunsToTheirLedgers: a run is its admission, not
// its name or its ledger's path. A data directory wiped and reused by a
// run of the same name, after its run settled or after it crashed
// unsettled, is a new admission, and the one before keeps what it spent
// or reserved, so a lifetime that holds one run refuses the second. A
// ledger that does not extend what its admission settled, one of a run
// started without a budget, and one admitted to another budget or
// dataset are refused with ErrAdmission. A withdrawn admission counts for
// nothing. The budget replays and audits the same.
func TestDatasetBudgetBindsRunsToTheirLedgers(t *testing.T) {
	step := accounting.SubsampledGaussian(0.01, 1.1)
	pld := func(n int64) float64 {
		e, err := accounting.PLD{}.Epsilon(step, n, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	lifetime := (pld(500) + pld(1000)) / 2 // one run of 500 fits, two do not
	open := func(t *testing.T) *DatasetBudget {
		path, err := CreateDatasetBudget(t.TempDir(), testDataset, "bind", lifetime, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		b, err := OpenDatasetBudget(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	const dir = "/data/run/ledger.log"

	t.Run("wiped after settling", func(t *testing.T) {
		b := open(t)
		a, err := b.Admit("r", RunLedger{Path: dir}, step, 500)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Settle(a.ID, fakeLedger(dir, "r", a, 500)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Admit("r", RunLedger{Path: dir}, step, 500); !errors.Is(err, ErrDatasetBudget) {
			t.Fatalf("the same run name in the wiped dir: %v, want ErrDatasetBudget (the settled run's 500 charges still count)", err)
		}
		if got := b.Spent(); got != pld(500) {
			t.Errorf("ε %v, want the settled run's %v", got, pld(500))
		}
		// A smaller second run fits, as a new admission beside the first.
		a2, err := b.Admit("r", RunLedger{Path: dir}, step, 100)
		if err != nil || a2.ID == a.ID {
			t.Fatalf("second run: admission %+v (%v), want a new one", a2, err)
		}
		if got := b.Spent(); got != pld(600) {
			t.Errorf("ε %v, want both runs' %v", got, pld(600))
		}
	})

	t.Run("wiped after a crash", func(t *testing.T) {
		b := open(t)
		a, err := b.Admit("r", RunLedger{Path: dir}, step, 500)
		if err != nil {
			t.Fatal(err)
		}
		_ = a // never settled: the process was killed
		if _, err := b.Admit("r", RunLedger{Path: dir}, step, 500); !errors.Is(err, ErrDatasetBudget) {
			t.Fatalf("after the crash and the wipe: %v, want ErrDatasetBudget (the crashed run keeps its reservation)", err)
		}
		// The crashed run resumed on its own ledger is its admission.
		got, err := b.Admit("r", fakeLedger(dir, "r", a, 37), step, 500)
		if err != nil || got != a {
			t.Fatalf("resuming the crashed run: %+v (%v), want its admission %+v", got, err, a)
		}
	})

	t.Run("ledgers that are not the admission's", func(t *testing.T) {
		b := open(t)
		a, err := b.Admit("r", RunLedger{Path: dir}, step, 500)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Settle(a.ID, fakeLedger(dir, "r", a, 200)); err != nil {
			t.Fatal(err)
		}
		other := a
		other.ID = "0123456789abcdef0123456789abcdef"
		forked := fakeLedger(dir, "r", a, 300)
		forked.Hashes = fakeLedger(dir, "r", other, 300).Hashes // same admission, another chain
		noBudget := fakeLedger(dir, "r", a, 10)
		noBudget.Run.AdmissionID = ""
		otherBudget := fakeLedger(dir, "r", Admission{Dataset: a.Dataset, Budget: "another", ID: a.ID, Epsilon: 1, Delta: 1e-5}, 10)
		otherData := fakeLedger(dir, "r", Admission{Dataset: strings.Repeat("ab", 32), Budget: a.Budget, ID: a.ID, Epsilon: 1, Delta: 1e-5}, 10)
		shorter := fakeLedger(dir, "r", a, 150)
		renamed := fakeLedger(dir, "r2", a, 250)
		_, before := b.file.Head()
		for name, rl := range map[string]RunLedger{"forked": forked, "no budget": noBudget, "other budget": otherBudget,
			"other dataset": otherData, "shorter than settled": shorter, "another run": renamed} {
			if _, err := b.Admit("r", rl, step, 500); !errors.Is(err, ErrAdmission) {
				t.Errorf("%s: Admit %v, want ErrAdmission", name, err)
			}
			if _, err := b.Settle(a.ID, rl); err == nil {
				t.Errorf("%s: Settle accepted", name)
			}
		}
		if _, after := b.file.Head(); after != before {
			t.Errorf("the refusals recorded %d records", after-before)
		}
		if _, err := b.Admit("r", fakeLedger(dir, "r", a, 250), step, 500); err != nil {
			t.Errorf("the ledger that extends the settled one: %v", err)
		}
	})

	t.Run("withdrawn", func(t *testing.T) {
		b := open(t)
		a, err := b.Admit("r", RunLedger{Path: dir}, step, 500)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Withdraw(a.ID, fakeLedger(dir, "r", a, 0)); !errors.Is(err, ErrAdmission) {
			t.Errorf("withdrawing a run whose ledger holds its run record: %v", err)
		}
		if _, err := b.Withdraw(a.ID, RunLedger{Path: dir}); err != nil {
			t.Fatal(err)
		}
		if got := b.Spent(); got != 0 {
			t.Errorf("ε %v after the only run was withdrawn", got)
		}
		if _, err := b.Withdraw(a.ID, RunLedger{Path: dir}); err == nil {
			t.Error("a second withdrawal was accepted")
		}
		if _, err := b.Admit("r", fakeLedger(dir, "r", a, 3), step, 500); !errors.Is(err, ErrAdmission) {
			t.Errorf("a ledger claiming the withdrawn admission: %v, want ErrAdmission", err)
		}
		path := b.Path()
		rep, err := AuditDatasetBudget(path)
		if err != nil || !rep.OK || rep.RecomputedEpsilon != 0 || len(rep.Runs) != 1 || rep.Runs[0].Open {
			t.Errorf("audit: %+v (%v)", rep, err)
		}
	})
}

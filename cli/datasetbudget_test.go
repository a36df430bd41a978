package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
)

// TestLocalDatasetBudget: two local runs on the same training set under
// one lifetime budget whose two plans, composed, exceed it. The first is
// admitted (creating the budget) and settles its charges; the second is
// refused before any release (its data dir holds no ledger, no Raft log)
// with an error naming the dataset, the budget and the steps left. The
// budget's history audits clean, a byte flip fails it, and the budget
// cannot be reset.
func TestLocalDatasetBudget(t *testing.T) {
	budgets := t.TempDir()
	// The lifetime ε: one run's (3) fits, two whole runs' do not.
	args := func(dir string, extra ...string) []string {
		return localArgs(dir, append([]string{"--budget-dir", budgets}, extra...)...)
	}
	first := t.TempDir()
	if out, err := run(t, args(first, "--dataset-epsilon", "3.3")...); err != nil {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	files, err := filepath.Glob(filepath.Join(budgets, "*.budget"))
	if err != nil || len(files) != 1 {
		t.Fatalf("budget files %v (%v)", files, err)
	}
	rep, err := ledger.AuditDatasetBudget(files[0])
	if err != nil || !rep.OK || len(rep.Runs) != 1 || rep.Runs[0].Open || rep.Runs[0].Charges != 40 {
		t.Fatalf("after the first run: %+v (%v)", rep, err)
	}
	second := t.TempDir()
	out, err := run(t, args(second)...)
	if !errors.Is(err, ledger.ErrDatasetBudget) {
		t.Fatalf("second run: %v, want ErrDatasetBudget\n%s", err, out)
	}
	for _, want := range []string{rep.Dataset[:12], "lifetime budget of ε = 3.3", "room for at most", "gaussian"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	for _, f := range []string{coordinator.LedgerFile, "raft"} {
		if _, err := os.Stat(filepath.Join(second, f)); err == nil {
			t.Errorf("the refused run left %s: it got as far as starting", f)
		}
	}
	again, err := ledger.AuditDatasetBudget(files[0])
	if err != nil || !again.OK || again.Records != rep.Records {
		t.Errorf("after the refusal: %+v (%v), want the same %d records", again, err, rep.Records)
	}
	if out, err := run(t, "ledger", "budget", "audit", files[0]); err != nil || !strings.Contains(out, "audit    OK") {
		t.Errorf("ledger budget audit: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0x20
	bad := filepath.Join(t.TempDir(), filepath.Base(files[0]))
	if err := os.WriteFile(bad, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "ledger", "budget", "audit", bad); !errors.Is(err, errAuditFailed) {
		t.Errorf("flipped byte: %v, want errAuditFailed\n%s", err, out)
	}
	if _, err := run(t, args(t.TempDir(), "--dataset-epsilon", "10")...); err == nil || !strings.Contains(err.Error(), "set once") {
		t.Errorf("resetting the lifetime ε: %v", err)
	}
}

// budgetFile returns the one dataset budget file in dir.
func budgetFile(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.budget"))
	if err != nil || len(files) != 1 {
		t.Fatalf("budget files in %s: %v (%v)", dir, files, err)
	}
	return files[0]
}

// auditBudget audits the budget file at path and requires it clean.
func auditBudget(t *testing.T, path string) ledger.DatasetAudit {
	t.Helper()
	rep, err := ledger.AuditDatasetBudget(path)
	if err != nil || !rep.OK {
		t.Fatalf("budget %s: %+v (%v)", path, rep, err)
	}
	return rep
}

// TestLocalDatasetBudgetReusedDataDir: a run admitted to a budget whose
// lifetime (1.1) holds one run at ε = 1 but not two (1.18) trains and settles;
// its data dir is wiped and the same command run again. That is a new run
// (its ledger starts from nothing), so the budget must refuse it: the
// first run's charges still count. Resuming the first run on its own data
// dir is the same admission, and changes nothing.
func TestLocalDatasetBudgetReusedDataDir(t *testing.T) {
	budgets := t.TempDir()
	dir := filepath.Join(t.TempDir(), "a")
	args := localArgs(dir, "--target-epsilon", "1", "--budget-dir", budgets, "--dataset-epsilon", "1.1")
	if out, err := run(t, args...); err != nil {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	rep := auditBudget(t, budgetFile(t, budgets))
	if len(rep.Runs) != 1 || rep.Runs[0].Open || rep.Runs[0].Charges != 40 || rep.Runs[0].Admission == "" {
		t.Fatalf("after the first run: %+v", rep.Runs)
	}
	first := rep.RecomputedEpsilon
	// The run's own ledger states the admission, in every report of it.
	var shown showResult
	if err := runJSON(t, &shown, "ledger", "show", dir, "--json"); err != nil {
		t.Fatal(err)
	}
	if a := shown.Admission; a == nil || a.ID != rep.Runs[0].Admission || a.Budget != rep.BudgetID || a.Dataset != rep.Dataset || a.Epsilon != 1.1 {
		t.Errorf("ledger show: admission %+v, want %s of budget %s", a, rep.Runs[0].Admission, rep.BudgetID)
	}
	if out, err := run(t, "ledger", "audit", dir); err != nil || !strings.Contains(out, "admission "+rep.Runs[0].Admission) {
		t.Errorf("ledger audit does not state the admission: %v\n%s", err, out)
	}
	// Resuming the finished run: its own admission, nothing new counted.
	if out, err := run(t, args...); err != nil {
		t.Fatalf("resuming the finished run: %v\n%s", err, out)
	}
	if again := auditBudget(t, budgetFile(t, budgets)); len(again.Runs) != 1 || again.RecomputedEpsilon != first {
		t.Fatalf("after resuming the finished run: ε %v (want %v), runs %+v", again.RecomputedEpsilon, first, again.Runs)
	}
	// Resumed without its budget: refused, since it could not settle.
	if out, err := run(t, localArgs(dir, "--target-epsilon", "1")...); err == nil || !strings.Contains(err.Error(), "resume it with --budget-dir "+budgets) {
		t.Fatalf("resuming the admitted run without --budget-dir: %v\n%s", err, out)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, args...)
	if !errors.Is(err, ledger.ErrDatasetBudget) {
		t.Fatalf("the same command in the wiped data dir: %v, want ErrDatasetBudget\n%s", err, out)
	}
	after := auditBudget(t, budgetFile(t, budgets))
	if len(after.Runs) != 1 || after.RecomputedEpsilon != first {
		t.Errorf("after the refusal: ε %v (want the first run's %v), runs %+v", after.RecomputedEpsilon, first, after.Runs)
	}
}

// TestLocalDatasetBudgetFileDeleted: the budget file of a dataset whose
// run has trained is deleted. The same command (the run's data dir
// intact: its ledger names the budget) is refused, and so is a new run in
// a data dir beside it (that ledger is evidence of the lost budget),
// however --dataset-epsilon is given again, with errors that say what to
// do. `ledger budget rebuild` writes the budget again from the run's
// ledger, under its old identity: the finished run resumes under it, and
// it counts what the run spent. A new budget forced with
// --force-new-dataset-budget (elsewhere) is created, and its audit against
// the ledgers beside it fails: it does not count the first run.
func TestLocalDatasetBudgetFileDeleted(t *testing.T) {
	budgets := t.TempDir()
	runs := t.TempDir()
	first := filepath.Join(runs, "a")
	args := func(dir, budgetDir string, extra ...string) []string {
		return localArgs(dir, append([]string{"--target-epsilon", "1", "--budget-dir", budgetDir, "--dataset-epsilon", "3"}, extra...)...)
	}
	if out, err := run(t, args(first, budgets)...); err != nil {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	path := budgetFile(t, budgets)
	rep := auditBudget(t, path)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, args(first, budgets)...)
	if !errors.Is(err, ledger.ErrAdmission) || !strings.Contains(err.Error(), "rebuild") {
		t.Fatalf("the same command without its budget file: %v, want ErrAdmission saying to rebuild\n%s", err, out)
	}
	second := filepath.Join(runs, "b")
	out, err = run(t, args(second, budgets)...)
	if !errors.Is(err, ledger.ErrAdmission) || !strings.Contains(err.Error(), "--force-new-dataset-budget") || !strings.Contains(err.Error(), first) {
		t.Fatalf("a new run beside the first one's ledger: %v, want ErrAdmission naming that ledger and the override\n%s", err, out)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("a refused run created a budget file")
	}

	out, err = run(t, "ledger", "budget", "rebuild", "--budget-dir", budgets, runs)
	if err != nil || !strings.Contains(out, "audit    OK") {
		t.Fatalf("ledger budget rebuild: %v\n%s", err, out)
	}
	rebuilt := auditBudget(t, budgetFile(t, budgets))
	if rebuilt.BudgetID != rep.BudgetID || rebuilt.RecomputedEpsilon != rep.RecomputedEpsilon || len(rebuilt.Runs) != 1 ||
		rebuilt.Runs[0].Admission != rep.Runs[0].Admission || rebuilt.Runs[0].Charges != rep.Runs[0].Charges {
		t.Fatalf("rebuilt %+v, want what the lost budget held: %+v", rebuilt, rep)
	}
	if out, err := run(t, args(first, budgets)...); err != nil || !strings.Contains(out, `"steps": 40`) {
		t.Fatalf("the first run resumed under the rebuilt budget: %v\n%s", err, out)
	}
	if out, err := run(t, "ledger", "budget", "audit", budgetFile(t, budgets), "--ledgers", runs); err != nil {
		t.Errorf("the rebuilt budget against the run ledgers: %v\n%s", err, out)
	}

	// Forced, elsewhere: created, with a warning, and it does not count
	// the first run, which its audit against the ledgers says.
	elsewhere := t.TempDir()
	stdout, stderr, err := runCmd(t, args(second, elsewhere, "--force-new-dataset-budget")...)
	if err != nil || !strings.Contains(stderr, "NOT counted") {
		t.Fatalf("forcing a new budget: %v\n%s\n%s", err, stdout, stderr)
	}
	out, err = run(t, "ledger", "budget", "audit", budgetFile(t, elsewhere), "--ledgers", runs)
	if !errors.Is(err, errAuditFailed) || !strings.Contains(out, "under another budget") {
		t.Errorf("the forced budget against the run ledgers: %v, want a failed audit naming the uncounted run\n%s", err, out)
	}
}

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

//go:build unix

package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/ledger"
)

// TestProcessDatasetBudgetKilledRunKeepsItsReservation: `coordinator
// local`, admitted to a dataset budget whose lifetime holds one run, is
// killed (SIGKILL: no settling) and its data dir wiped; the same command
// again must be refused, since the killed run may have spent up to its
// whole reservation. (A run's admission was once keyed by its name and
// ledger path, and re-admitting that key replaced what the killed run
// counted.) The budget still counts the killed run, open, for its
// reservation.
func TestProcessDatasetBudgetKilledRunKeepsItsReservation(t *testing.T) {
	h := New(t)
	budgets := h.Dir("budgets")
	dataDir := filepath.Join(h.Dir("runs"), "a")
	metricsAddr := FreeAddr(t)
	args := append(localArgs(dataDir, metricsAddr), "--target-epsilon", "1", "--budget-dir", budgets, "--dataset-epsilon", "1.2")

	p := h.Start("local-killed", h.Bin.Coordinator, args...)
	h.WaitFor(60*time.Second, "local to apply step 5", func() (bool, error) {
		if err := p.exitedErr(); err != nil {
			return false, err
		}
		st, err := scrapeCoordinator(metricsAddr)
		return err == nil && st.step >= 5, nil
	})
	p.Kill()
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	out, code := h.run(h.Bin.Coordinator, args...)
	if code == 0 || !strings.Contains(string(out), "lifetime privacy budget does not allow this run") {
		h.Fatalf("the same command after the kill and the wipe: exit %d, want the dataset budget's refusal\n%s", code, out)
	}
	files, err := filepath.Glob(filepath.Join(budgets, "*.budget"))
	if err != nil || len(files) != 1 {
		h.Fatalf("budget files %v (%v)", files, err)
	}
	show, code := h.run(h.Bin.Coordinator, "ledger", "budget", "show", files[0], "--json")
	var rep ledger.DatasetAudit
	if err := json.NewDecoder(bytes.NewReader(jsonPart(show))).Decode(&rep); err != nil || code != 0 {
		h.Fatalf("ledger budget show: exit %d, %v\n%s", code, err, show)
	}
	if !rep.OK || len(rep.Runs) != 1 || !rep.Runs[0].Open || rep.Runs[0].Reserved < 1000 {
		h.Fatalf("the budget after the refusal: %+v, want the killed run alone, open for its whole reservation", rep)
	}
}

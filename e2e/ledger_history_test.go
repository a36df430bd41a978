//go:build unix

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/ledger"
)

// localArgs are the arguments of a small `coordinator local` run: logistic
// regression on the synthetic gaussian data with two in-process nodes, σ
// calibrated for 1000 steps (so the runs here are interrupted long before
// they end), seeded noise (NOT private: fine in tests).
func localArgs(dataDir, metricsAddr string) []string {
	return []string{"local", "--data-dir", dataDir, "--metrics-addr", metricsAddr,
		"--run", "e2e-history", "--dataset", "gaussian", "--model", "logreg", "--batch-size", "100",
		"--max-steps", "1000", "--nodes", "2", "--eval-every", "0", "--insecure-seed", "7", "--progress", "off"}
}

// runLocalUntil starts `coordinator local` as process name, waits until it
// has applied at least step steps, interrupts it with SIGINT and requires
// a clean exit (0, "interrupted after N steps"). It returns N.
func runLocalUntil(h *Harness, name string, args []string, metricsAddr string, step int) int {
	h.t.Helper()
	p := h.Start(name, h.Bin.Coordinator, args...)
	h.WaitFor(60*time.Second, fmt.Sprintf("%s to apply step %d", name, step), func() (bool, error) {
		if err := p.exitedErr(); err != nil {
			return false, err
		}
		st, err := scrapeCoordinator(metricsAddr)
		return err == nil && st.step >= float64(step), nil
	})
	p.Signal(os.Interrupt)
	if ps := p.Wait(30 * time.Second); ps.ExitCode() != 0 {
		h.Fatalf("%s after SIGINT: %v, want exit 0", name, ps)
	}
	m := regexp.MustCompile(`interrupted after (\d+) steps`).FindStringSubmatch(p.Logs())
	if m == nil {
		h.Fatalf("%s did not report the interruption", name)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// auditLedger runs `coordinator ledger audit PATH --json` and decodes the
// report (a failed audit's error line follows it).
func auditLedger(h *Harness, path string) (AuditReport, int, string) {
	h.t.Helper()
	out, code := h.run(h.Bin.Coordinator, "ledger", "audit", path, "--json")
	var rep AuditReport
	if err := json.NewDecoder(bytes.NewReader(jsonPart(out))).Decode(&rep); err != nil {
		h.Fatalf("e2e: ledger audit %s (exit %d): %v\n%s", path, code, err, out)
	}
	return rep, code, string(out)
}

// TestProcessLedgerHistory is issue 11 item 3's CLI scenario, with the
// real binary: `coordinator local` trains, is interrupted (SIGINT), and
// everything in its data dir but ledger.log is deleted (an operator
// "fixing" a broken data dir). Run again, the replica must refuse to start
// with an error that says what happened and what to do, leaving the
// ledger as it was (before the fix it started a new Raft history whose
// first releases, at indexes the ledger had charged, went uncharged).
//
// Then the operator does what the error says, trains again in a fresh
// data dir, and the test builds the ledger the unfixed coordinator would
// have left: the first ledger continued by the second run's charges past
// its last index, ε accounted on. Every record verifies and steps, indexes
// and ε all look continuous, but `coordinator ledger audit` must fail,
// naming the reuse across Raft histories.
func TestProcessLedgerHistory(t *testing.T) {
	h := New(t)
	dataDir := h.Dir("data")
	metricsAddr := FreeAddr(t)
	args := localArgs(dataDir, metricsAddr)
	ledgerPath := filepath.Join(dataDir, "ledger.log")

	// 1. Train, interrupt: the ledger audits clean, one charge per step
	// applied (the Raft state says which) and at most one more, charged
	// ahead of its g̃ when the interruption came.
	stepsA := runLocalUntil(h, "local-a", args, metricsAddr, 20)
	repA, code, out := auditLedger(h, dataDir)
	if code != 0 || !repA.OK || repA.Applied != stepsA || repA.Charges != repA.Applied+repA.Unapplied || repA.Unapplied > 1 || repA.History == "" {
		h.Fatalf("audit after the interrupted run (%d steps): exit %d\n%s", stepsA, code, out)
	}
	t.Logf("run A: %d steps, history %s", repA.Applied, repA.History)

	// 2. Delete everything but the ledger; run the same command again.
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "ledger.log" {
			if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	ledgerA, err := os.ReadFile(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	again := h.Start("local-again", h.Bin.Coordinator, args...)
	if ps := again.Wait(60 * time.Second); ps.ExitCode() == 0 {
		h.Fatalf("local started on a data dir whose Raft state was deleted: %v", ps)
	}
	for _, want := range []string{"will not start", "Raft state is empty", "restore", "new data directory"} {
		if !strings.Contains(again.Logs(), want) {
			h.Fatalf("the refusal does not say %q", want)
		}
	}
	if strings.Contains(again.Logs(), "run configured") {
		h.Fatalf("the refused replica applied a configuration")
	}
	if b, _ := os.ReadFile(ledgerPath); !bytes.Equal(b, ledgerA) {
		h.Fatalf("the refused start changed the ledger")
	}
	// The Raft state is gone, the ledger stands: it states no less than
	// was spent, and the audit passes, noting the loss.
	if rep, code, out := auditLedger(h, dataDir); code != 0 || rep.Charges != repA.Charges || rep.HeadHash != repA.HeadHash {
		h.Fatalf("audit after the refused start: exit %d\n%s", code, out)
	}

	// 3. Train again with the ledger moved away: a new Raft history, past
	// the first ledger's last index.
	keptA := filepath.Join(h.Dir("kept"), "ledger-a.log")
	if err := os.Rename(ledgerPath, keptA); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	recsA, _, err := ledger.ReadFile(keptA)
	if err != nil {
		t.Fatal(err)
	}
	lastA := recsA[len(recsA)-1]
	runLocalUntil(h, "local-b", args, metricsAddr, int(lastA.Step)+10)
	repB, code, out := auditLedger(h, dataDir)
	if code != 0 || !repB.OK || repB.History == "" || repB.History == repA.History {
		h.Fatalf("audit of the second run: exit %d\n%s", code, out)
	}

	// 4. The ledger reused across the two histories, as the unfixed
	// coordinator left it: A's records, then B's charges at indexes past
	// A's last, re-chained, with ε accounted on from A's.
	recsB, _, err := ledger.ReadFile(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	reused := filepath.Join(h.Dir("reused"), "ledger.log")
	f, _, err := ledger.OpenFile(reused)
	if err != nil {
		t.Fatal(err)
	}
	acc, err := ledger.NewReplay(recsA[0])
	if err != nil {
		t.Fatal(err)
	}
	appended := 0
	for _, r := range append(recsA, recsB[1:]...) {
		if r.Kind == ledger.RecordCharge {
			if r.History != recsA[0].History && r.Index <= lastA.Index {
				continue // the unfixed coordinator took these for replays
			}
			if r.History != recsA[0].History {
				appended++
			}
			if r.Epsilon, err = acc.Charge(*r.Event); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := f.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if appended == 0 {
		t.Fatalf("run B has no charge past run A's last index %d", lastA.Index)
	}
	rep, code, out := auditLedger(h, reused)
	if code == 0 || rep.OK {
		h.Fatalf("ledger audit passed a ledger reused across two Raft histories:\n%s", out)
	}
	if len(rep.Problems) != appended {
		h.Fatalf("audit found %d problems, want one per charge of the second history (%d):\n%s", len(rep.Problems), appended, out)
	}
	for _, p := range rep.Problems {
		if !strings.Contains(p, "reused across Raft histories") || !strings.Contains(p, repB.History) {
			h.Fatalf("audit problem %q does not name the reuse of history %s", p, repB.History)
		}
	}
	t.Logf("run B: history %s; the reused ledger (A + %d of B's charges) fails the audit", repB.History, appended)
}

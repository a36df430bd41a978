package cli

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/privacyaudit"
)

// auditArgs is a small, fast audit: logistic regression on the synthetic
// Gaussian mixture across 2 nodes, 60 steps.
func auditArgs(dir string, extra ...string) []string {
	return append([]string{"audit-privacy", "--dataset", "gaussian", "--model", "logreg",
		"--batch-size", "100", "--max-steps", "60", "--eval-every", "0", "--round-timeout", "20s", "--nodes", "2",
		"--canaries", "200", "--input-canaries", "100", "--target-epsilon", "2",
		"--data-dir", dir, "--progress", "off", "--run", "t-audit", "--json"}, extra...)
}

// TestAuditPrivacyRunsTheRealPath runs audit-privacy in-process (embedded
// NATS, a Raft replica, two nodes with canaries): the run is named and
// marked as an audit, the auditor reads one release per step from the
// replica's Raft log, the ledger's ε is the target, both audits count
// their canaries and give a bound within [0, ceiling], and an intact
// mechanism is not reported as a privacy bug.
func TestAuditPrivacyRunsTheRealPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	stdout, stderr, err := runCmd(t, auditArgs(dir)...)
	if err != nil {
		t.Fatalf("audit-privacy: %v\n%s", err, stderr)
	}
	var res auditResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if res.Run != "audit-t-audit" || res.Steps != 60 || res.Releases != res.Steps {
		t.Errorf("run %q, %d steps, %d releases read; want audit-t-audit, 60, 60", res.Run, res.Steps, res.Releases)
	}
	if res.LedgerEpsilon > 2 || res.LedgerEpsilon < 1.99 || res.Delta != 1e-5 || res.Confidence != 0.95 {
		t.Errorf("ledger ε %v at δ %v, confidence %v; want 2, 1e-5, 0.95", res.LedgerEpsilon, res.Delta, res.Confidence)
	}
	for name, a := range map[string]*auditMethod{"white-box": &res.WhiteBox, "black-box": res.BlackBox} {
		if a == nil {
			t.Fatalf("%s: no result", name)
		}
		want := map[string]int{"white-box": 200, "black-box": 100}[name]
		if a.Canaries != want || a.Included <= 0 || a.Included >= want || len(a.Splits) != 4 {
			t.Errorf("%s: %d canaries (%d included), %d splits; want %d, 4", name, a.Canaries, a.Included, len(a.Splits), want)
		}
		if !(a.Epsilon >= 0 && a.Epsilon <= a.Ceiling) || a.Epsilon > res.LedgerEpsilon {
			t.Errorf("%s: bound %v, ceiling %v, ledger %v", name, a.Epsilon, a.Ceiling, res.LedgerEpsilon)
		}
		if a.RunCurveRejected || !(a.EpsilonRunCurve >= 0 && a.EpsilonRunCurve < res.LedgerEpsilon) || a.RunCurveSigma != 0 && !(a.RunCurveSigma > res.Sigma) {
			t.Errorf("%s: run-curve bound %v (σ' %v, rejected %v), ledger %v at σ %v", name, a.EpsilonRunCurve, a.RunCurveSigma, a.RunCurveRejected, res.LedgerEpsilon, res.Sigma)
		}
	}
	if res.PrivacyBug || res.RunCurveRejected {
		t.Error("an intact mechanism reported as a privacy bug")
	}
	if r := res.Reach; r == nil || r.Reps != 21 || !(r.P10 <= r.Median && r.Median <= r.P90 && r.P90 <= r.Ceiling) || r.Ceiling != res.WhiteBox.Ceiling {
		t.Errorf("white-box reach %+v, want 21 simulations with ordered quantiles and the white-box ceiling %v", r, res.WhiteBox.Ceiling)
	}
	b, err := os.ReadFile(filepath.Join(dir, auditFile))
	if err != nil {
		t.Fatal(err)
	}
	var saved auditResult
	if err := json.Unmarshal(b, &saved); err != nil || saved.Steps != res.Steps || saved.WhiteBox.Epsilon != res.WhiteBox.Epsilon {
		t.Errorf("%s holds %+v (err %v), want the printed result", auditFile, saved, err)
	}
	// An audit runs once: the same data dir is refused.
	if _, _, err := runCmd(t, auditArgs(dir)...); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("second audit in the same data dir: %v, want refused", err)
	}
}

// TestAuditPrivacyFlags: bad audit flags are errors before anything runs.
func TestAuditPrivacyFlags(t *testing.T) {
	for _, extra := range [][]string{
		{"--canaries", "5"}, {"--input-canaries", "3"}, {"--canary-scale", "1"}, {"--canary-support", "0"},
		{"--beta", "1"}, {"--nodes", "0"}, {"--reach-reps", "-1"},
		{"--canaries", "7851", "--canary-support", "1"}, // logreg on the mixture: 7850 parameters
	} {
		dir := filepath.Join(t.TempDir(), "audit")
		if _, _, err := runCmd(t, auditArgs(dir, extra...)...); err == nil {
			t.Errorf("%v: no error", extra)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%v: the data dir was created", extra)
		}
	}
}

// TestAuditFitDim: with support 1 the default m is capped at the model's
// parameters, a given m above them refused, and other supports left
// alone.
func TestAuditFitDim(t *testing.T) {
	for _, c := range []struct {
		m, support int
		changed    bool
		want       int
		fails      bool
	}{
		{defaultCanaries, 1, false, 7850, false},
		{7850, 1, true, 7850, false},
		{7851, 1, true, 0, true},
		{20000, 4, true, 20000, false},
		{100, 1, false, 100, false},
	} {
		f := auditFlags{canaries: c.m, canarySupport: c.support, canariesChanged: c.changed}
		err := f.fitDim(7850)
		if (err != nil) != c.fails || !c.fails && f.canaries != c.want {
			t.Errorf("%+v: m %d, err %v; want m %d, failing %v", c, f.canaries, err, c.want, c.fails)
		}
	}
}

func TestAuditRunName(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"x", "audit-x"}, {"audit-x", "audit-x"}, {strings.Repeat("a", 64), "audit-" + strings.Repeat("a", 58)},
	} {
		if got := auditRunName(c.in); got != c.want {
			t.Errorf("auditRunName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestPrintPrivacyAuditReach: the text output gives the white-box reach
// beside the bound, and omits it when the simulation was skipped.
func TestPrintPrivacyAuditReach(t *testing.T) {
	res := auditResult{Run: "audit-x", Steps: 10, LedgerEpsilon: 2, Delta: 1e-5, Confidence: 0.95,
		WhiteBox: auditMethod{Canaries: 100, Epsilon: 0.1, Ceiling: 1},
		Reach:    &privacyaudit.Reach{Reps: 21, Median: 0.25, P10: 0.125, P90: 0.5, Ceiling: 1}}
	var b strings.Builder
	if err := printPrivacyAudit(&b, res, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "white-box reach") || !strings.Contains(b.String(), "median 0.2500, 10–90% 0.1250–0.5000") {
		t.Errorf("output without the reach:\n%s", b.String())
	}
	res.Reach = nil
	b.Reset()
	if err := printPrivacyAudit(&b, res, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "reach") {
		t.Errorf("a skipped simulation printed:\n%s", b.String())
	}
}

// TestAuditMethodExceeds: the (ε, δ) bound above the ledger's ε is a
// privacy bug (the exit status); the f-DP bound above it only a suspected
// one (the mechanism is not μ-GDP); a missing black-box method is
// neither.
func TestAuditMethodExceeds(t *testing.T) {
	for _, c := range []struct {
		eps, fdp     float64
		bug, suspect bool
	}{{0.5, 0.9, false, false}, {1.5, 0.9, true, false}, {0.5, 1.5, false, true}, {1, 1, false, false}, {1.5, 1.6, true, true}} {
		a := auditMethod{Epsilon: c.eps, EpsilonFDP: c.fdp}
		if got := a.exceeds(1); got != c.bug {
			t.Errorf("(ε, δ) bound %v, f-DP bound %v at ledger ε 1: exceeds = %v, want %v", c.eps, c.fdp, got, c.bug)
		}
		if got := a.fdpExceeds(1); got != c.suspect {
			t.Errorf("(ε, δ) bound %v, f-DP bound %v at ledger ε 1: fdpExceeds = %v, want %v", c.eps, c.fdp, got, c.suspect)
		}
	}
	var none *auditMethod
	if none.exceeds(1) || none.fdpExceeds(1) {
		t.Error("a nil method exceeds")
	}
}

// TestPrintPrivacyAuditFDP: the text output gives the f-DP bound, its μ
// and ceiling beside the (ε, δ) one, and the reach under both analyses.
func TestPrintPrivacyAuditFDP(t *testing.T) {
	res := auditResult{Run: "audit-x", Steps: 10, LedgerEpsilon: 2, Delta: 1e-5, Confidence: 0.95,
		WhiteBox: auditMethod{Canaries: 100, Epsilon: 0.1, Ceiling: 1, EpsilonFDP: 0.375, GDPMu: 0.125, CeilingFDP: 3},
		Reach:    &privacyaudit.Reach{Reps: 21, Median: 0.25, P10: 0.125, P90: 0.5, Ceiling: 1, FDPMedian: 0.75, FDPP10: 0.5, FDPP90: 1, FDPMax: 1.25}}
	var b strings.Builder
	if err := printPrivacyAudit(&b, res, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"f-DP analysis: ε ≥ 0.3750", "μ < 0.1250", "ceiling 3.0000", "f-DP analysis: median 0.7500, 10–90% 0.5000–1.0000, largest 1.2500"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output without %q:\n%s", want, b.String())
		}
	}
}

// TestAuditErrRunCurve: rejecting the run's own curve fails the command
// (a proof, like the (ε, δ) bound), and the text output says so beside the
// run-curve bound; a μ-GDP bound above the ledger's ε does not.
func TestAuditErrRunCurve(t *testing.T) {
	res := auditResult{Run: "audit-x", Steps: 10, Sigma: 1, LedgerEpsilon: 2, Delta: 1e-5, Confidence: 0.95,
		WhiteBox: auditMethod{Canaries: 100, Epsilon: 0.5, EpsilonFDP: 2.5, EpsilonRunCurve: 1.75, RunCurveSigma: 1.125}}
	if err := auditErr(res); err != nil {
		t.Fatalf("μ-GDP bound above the ledger's ε: %v, want no error", err)
	}
	res.WhiteBox.RunCurveRejected, res.RunCurveRejected, res.PrivacyBug = true, true, true
	if err := auditErr(res); !errors.Is(err, errRunCurveRejected) {
		t.Fatalf("run curve rejected: %v, want errRunCurveRejected", err)
	}
	var b strings.Builder
	if err := printPrivacyAudit(&b, res, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"run's own curve: ε ≥ 1.7500", "σ' = 1.1250; the run's σ = 1.0000: REJECTED", "PRIVACY BUG: the guesses reject"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output without %q:\n%s", want, b.String())
		}
	}
	res.WhiteBox.Epsilon = 3
	if err := auditErr(res); !errors.Is(err, errPrivacyBug) {
		t.Fatalf("(ε, δ) bound above the ledger's ε: %v, want errPrivacyBug", err)
	}
}

// TestAuditPrivacyChargesTheDatasetBudget: audit-privacy trains on the
// private set, so with --budget-dir it is admitted to the set's lifetime
// budget and settles what it charged, like any run; a run of `local` on
// the same data is then refused when both do not fit.
func TestAuditPrivacyChargesTheDatasetBudget(t *testing.T) {
	budgets := t.TempDir()
	dir := filepath.Join(t.TempDir(), "audit")
	stdout, stderr, err := runCmd(t, auditArgs(dir, "--reach-reps", "0", "--budget-dir", budgets, "--dataset-epsilon", "2.1")...)
	if err != nil {
		t.Fatalf("audit-privacy: %v\n%s\n%s", err, stdout, stderr)
	}
	rep := auditBudget(t, budgetFile(t, budgets))
	if len(rep.Runs) != 1 || rep.Runs[0].Run != "audit-t-audit" || rep.Runs[0].Open || rep.Runs[0].Charges != 60 {
		t.Fatalf("the budget after the audit: %+v, want the audit's run settled at its 60 charges", rep.Runs)
	}
	out, err := run(t, localArgs(t.TempDir(), "--target-epsilon", "2", "--budget-dir", budgets)...)
	if !errors.Is(err, ledger.ErrDatasetBudget) {
		t.Fatalf("a run at ε = 2 after the audit at ε = 2, lifetime 2.1: %v, want ErrDatasetBudget\n%s", err, out)
	}
}

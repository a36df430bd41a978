package cli

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// TestLocalRefusesOutlierLabel: one mistyped integer label (50000 among
// 0…2) does not build a 50,001-class model; the load fails naming the
// label, its row and the flags that override it.
func TestLocalRefusesOutlierLabel(t *testing.T) {
	dir := t.TempDir()
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	_, rest, _ := strings.Cut(lines[6], ",")
	lines[6] = "50000," + rest // data row 7
	bad := filepath.Join(dir, "typo.csv")
	writeFile(t, bad, strings.Join(lines, "\n"))
	args := []string{"local", "--data-path", bad, "--model", "logreg", "--batch-size", "60", "--max-steps", "2",
		"--nodes", "1", "--data-dir", t.TempDir(), "--run", "t-typo", "--progress", "off"}
	_, _, err = runCmd(t, args...)
	if err == nil {
		t.Fatal("a run with one label of 50000 among 0…2 started; want the load refused")
	}
	wantOneLine(t, err, "label 50000 in data row 7 would make 50001 classes", "--classes", "--labels")
}

// wantOneLine checks that err is one line saying each of wants.
func wantOneLine(t *testing.T, err error, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q is more than one line", err)
	}
}

// TestLocalRefusesDeltaAboveOneOverN: δ ≥ 1/N is no privacy (publishing
// one example whole satisfies it); local refuses it in one line naming δ,
// N and 1/N, and without --delta the run gets δ = 1e-5 below N = 1e5.
func TestLocalRefusesDeltaAboveOneOverN(t *testing.T) {
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, t.TempDir(), "train.csv", csvTrainRows, 11)
	_, _, err := runCmd(t, csvLocalArgs(t, data, spec, "--sigma", "1", "--delta", "0.5")...)
	if err == nil {
		t.Fatal("--delta 0.5 with N = 600 ran; want it refused")
	}
	wantOneLine(t, err, "delta 0.5", "1/N = 0.00167", "N = 600")
	res := localJSON(t, csvLocalArgs(t, data, spec, "--sigma", "1"))
	if got := res["delta"]; got != 1e-5 {
		t.Errorf("δ = %v without --delta, want 1e-5", got)
	}
}

// TestKeepLedgerDelta: a run resumed from a ledger keeps the δ it
// records (1e-5, from before δ depended on N) even with N ≥ 1e5, where a
// new run derives 1e-7 and a δ of 1e-5 given explicitly is refused.
func TestKeepLedgerDelta(t *testing.T) {
	m, err := loadModel("logreg", "")
	if err != nil {
		t.Fatal(err)
	}
	resumed := t.TempDir()
	l, err := ledger.Open(filepath.Join(resumed, coordinator.LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start("old", 3, 1e-5, seed.Crypto, ledger.MechanismDiscrete, "", ""); err != nil {
		t.Fatal(err)
	}
	l.Close()
	const n = 133080 // fortunes-seq
	for _, tc := range []struct {
		name  string
		dir   string
		delta float64
		want  float64 // 0: refused
	}{
		{"resumed", resumed, 0, 1e-5},
		{"new", t.TempDir(), 0, 1e-7},
		{"new, given", t.TempDir(), 1e-8, 1e-8},
		{"resumed, given at 1/N or more", resumed, 1e-5, 0},
	} {
		spec := defaultRunSpec()
		spec.Sigma, spec.Delta = 1, tc.delta
		spec.keepLedgerDelta(tc.dir)
		c, err := spec.runConfig(m, n, "", false, "", slog.New(slog.DiscardHandler))
		switch {
		case tc.want == 0 && !errors.Is(err, coordinator.ErrInvalidPlan):
			t.Errorf("%s: δ %v, err %v; want ErrInvalidPlan", tc.name, c.Delta, err)
		case tc.want != 0 && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case c.Delta != tc.want:
			t.Errorf("%s: δ = %v, want %v", tc.name, c.Delta, tc.want)
		}
	}
}

// TestLocalStopsDivergedTraining: with --lr 1e10 the evaluation loss
// explodes; the run stops at the next round after the evaluation that
// shows it, like a budget stop (exit status 0, its ledger kept), saying why:
// in --json's "stopped", and in the text output on a WARNING line of its
// own. θ₀'s evaluation, the base of the rule, is logged at step 0.
func TestLocalStopsDivergedTraining(t *testing.T) {
	dir := t.TempDir()
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	eval := writeMixtureCSV(t, dir, "eval.csv", csvEvalRows, 12)
	args := func() []string {
		return csvLocalArgs(t, data, spec, "--eval-path", eval, "--sigma", "1", "--target-epsilon", "20", "--lr", "1e10",
			"--algorithm", "dp-sgd", "--max-steps", "60")
	}
	res := localJSON(t, args())
	stopped, _ := res["stopped"].(string)
	if !strings.HasPrefix(stopped, "training diverged: evaluation loss") {
		t.Fatalf("stopped %q after %v steps; want the divergence stop", stopped, res["steps"])
	}
	if steps := res["steps"].(float64); !(steps >= 5 && steps < 60) {
		t.Errorf("stopped after %v steps; want soon after the first evaluation that diverged (every 5 steps)", steps)
	}

	out, logs, err := runCmd(t, args()...)
	if err != nil {
		t.Fatalf("local: %v\nlogs:\n%s", err, logs)
	}
	if !strings.Contains(out, "\nWARNING: training diverged: evaluation loss") || !strings.Contains(out, "; the ledger holds what was spent") {
		t.Errorf("text output has no WARNING line for the divergence:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)msg="test evaluation" step=0 .* epsilon=0$`).MatchString(logs) {
		t.Errorf("θ₀'s evaluation (step 0, ε 0) is not logged:\n%s", logs)
	}
}

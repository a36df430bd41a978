package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// TestRunConfigNoise: new runs get the discrete mechanism and a σ
// calibrated with the event the ledger will charge for it, so 1000 steps
// spend the budget and no more; --noise float keeps the Gaussian
// calibration; other values are refused.
func TestRunConfigNoise(t *testing.T) {
	m, err := loadModel("mlp", "")
	if err != nil {
		t.Fatal(err)
	}
	const n = 60000
	spec := defaultRunSpec()
	c, err := spec.runConfig(m, n, "", false, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.NoiseMode != coordinator.NoiseDiscrete {
		t.Fatalf("default noise mode %q", c.NoiseMode)
	}
	// The default accountant, PLD, charges the discrete Gaussian with its
	// lattice: 1000 steps spend the budget and no more.
	if c.Accountant != coordinator.AccountantPLD {
		t.Fatalf("default accountant %q", c.Accountant)
	}
	pld, err := accounting.PLD{}.Epsilon(c.Event(), spec.MaxSteps, c.Delta)
	if err != nil || pld > spec.TargetEpsilon || pld < spec.TargetEpsilon*(1-1e-5) {
		t.Errorf("discrete PLD run: ε after %d steps = %v (%v), target %v", spec.MaxSteps, pld, err, spec.TargetEpsilon)
	}
	pldSigma := c.Optimizer.NoiseMultiplier
	spec.Accountant = coordinator.AccountantRDP
	if c, err = spec.runConfig(m, n, "", false, "", nil); err != nil {
		t.Fatal(err)
	}
	eps, _, err := accounting.RDP{}.EpsilonOrder(c.Event(), spec.MaxSteps, c.Delta)
	if err != nil || eps > spec.TargetEpsilon || eps < spec.TargetEpsilon*(1-1e-6) {
		t.Errorf("discrete RDP run: ε after %d steps = %v (%v), target %v", spec.MaxSteps, eps, err, spec.TargetEpsilon)
	}
	if !(pldSigma < c.Optimizer.NoiseMultiplier) {
		t.Errorf("discrete PLD σ %v not below RDP σ %v", pldSigma, c.Optimizer.NoiseMultiplier)
	}
	floatSpec := defaultRunSpec()
	floatSpec.Noise, floatSpec.Accountant = coordinator.NoiseFloat, coordinator.AccountantRDP
	fc, err := floatSpec.runConfig(m, n, "", false, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := accounting.RDP{}.Calibrate(spec.TargetEpsilon*(1-1e-9), spec.MaxSteps, 1e-5, func(s float64) accounting.Event { return accounting.SubsampledGaussian(spec.BatchSize/n, s) })
	if fc.NoiseMode != coordinator.NoiseFloat || fc.Optimizer.NoiseMultiplier != want {
		t.Errorf("float run: mode %q σ %v, want σ %v", fc.NoiseMode, fc.Optimizer.NoiseMultiplier, want)
	}
	// The grid costs the discrete run a relative 2⁻¹⁶ of σ, and the
	// fractional orders' interpolation a little more.
	if s, f := c.Optimizer.NoiseMultiplier, fc.Optimizer.NoiseMultiplier; s < f || s > f*1.01 {
		t.Errorf("discrete σ %v, float σ %v", s, f)
	}
	spec.Noise = "gaussian"
	if _, err := spec.runConfig(m, n, "", false, "", nil); err == nil || !strings.Contains(err.Error(), "noise \"gaussian\"") {
		t.Errorf("unknown noise: %v", err)
	}
}

// TestKeepLegacyNoise: a data dir whose ledger predates noise modes keeps
// the floating-point sampler (and the σ it was calibrated with), whatever
// --noise says; a ledger that names its mechanism, or none at all, leaves
// the spec alone.
func TestKeepLegacyNoise(t *testing.T) {
	m, err := loadModel("logreg", "")
	if err != nil {
		t.Fatal(err)
	}
	startLedger := func(mechanism string) string {
		dir := t.TempDir()
		l, err := ledger.Open(filepath.Join(dir, coordinator.LedgerFile))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.Start("old", 3, 1e-5, seed.Crypto, mechanism, "", ""); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		dir  string
		want string
	}{
		{startLedger(""), coordinator.NoiseLegacy},
		{startLedger(ledger.MechanismDiscrete), coordinator.NoiseDiscrete},
		{t.TempDir(), coordinator.NoiseDiscrete},
	} {
		spec := defaultRunSpec()
		spec.keepLegacyNoise(tc.dir, log)
		spec.keepLegacyAccountant(tc.dir, log)
		c, err := spec.runConfig(m, 10000, "", false, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.NoiseMode != tc.want {
			t.Errorf("%s: noise mode %q, want %q", tc.dir, c.NoiseMode, tc.want)
		}
		if tc.want == coordinator.NoiseLegacy {
			want, _ := accounting.RDP{}.Calibrate(spec.TargetEpsilon*(1-1e-9), spec.MaxSteps, 1e-5, func(s float64) accounting.Event { return accounting.SubsampledGaussian(spec.BatchSize/10000, s) })
			if c.Optimizer.NoiseMultiplier != want {
				t.Errorf("legacy σ %v, want the Gaussian calibration %v", c.Optimizer.NoiseMultiplier, want)
			}
		}
	}
}

// TestRunFileAccountant: the run file's accountant key and --accountant
// (which wins) choose the run's accountant; unset, a float run gets PLD and
// a discrete run RDP; PLD with discrete noise and unknown names are
// refused; a data dir whose ledger predates accountants keeps RDP
// whatever is asked, and one that names its accountant is left alone.
func TestRunFileAccountant(t *testing.T) {
	m, err := loadModel("logreg", "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := func(body string) string {
		p := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+fmt.Sprint(len(body))+".yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	config := func(body string, args ...string) (coordinator.RunConfig, error) {
		spec := defaultRunSpec()
		spec.MaxSteps = 50
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		spec.bind(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := loadRunSpec(&spec, file(body), fs); err != nil {
			return coordinator.RunConfig{}, err
		}
		return spec.runConfig(m, 10000, "", false, "", nil)
	}
	for _, tc := range []struct {
		body string
		args []string
		want string
	}{
		{"noise: float\n", nil, coordinator.AccountantPLD},
		{"noise: discrete\n", nil, coordinator.AccountantPLD},
		{"noise: discrete\naccountant: rdp\n", nil, coordinator.AccountantRDP},
		{"noise: discrete\naccountant: pld\n", nil, coordinator.AccountantPLD},
		{"noise: float\naccountant: rdp\n", nil, coordinator.AccountantRDP},
		{"noise: float\naccountant: rdp\n", []string{"--accountant", "pld"}, coordinator.AccountantPLD},
	} {
		c, err := config(tc.body, tc.args...)
		if err != nil || c.Accountant != tc.want {
			t.Errorf("%q %v: accountant %q (%v), want %q", tc.body, tc.args, c.Accountant, err, tc.want)
		}
	}
	for _, body := range []string{"noise: discrete\naccountant: prv\n", "noise: float\naccountant: moments\n"} {
		if _, err := config(body); !errors.Is(err, coordinator.ErrInvalidPlan) || !strings.Contains(err.Error(), "accountant") {
			t.Errorf("%q: %v, want ErrInvalidPlan naming the accountant", body, err)
		}
	}

	startLedger := func(accountant string) string {
		dir := t.TempDir()
		l, err := ledger.Open(filepath.Join(dir, coordinator.LedgerFile))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.Start("old", 3, 1e-5, seed.Crypto, ledger.MechanismFloat, accountant, "h"); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		dir  string
		want string
	}{
		{startLedger(""), coordinator.AccountantLegacy},
		{startLedger(ledger.AccountantPLD), coordinator.AccountantPLD},
		{t.TempDir(), coordinator.AccountantPLD},
	} {
		spec := defaultRunSpec()
		spec.Noise, spec.Accountant = coordinator.NoiseFloat, coordinator.AccountantPLD
		spec.keepLegacyAccountant(tc.dir, log)
		c, err := spec.runConfig(m, 10000, "", false, "", nil)
		if err != nil || c.Accountant != tc.want {
			t.Errorf("%s: accountant %q (%v), want %q", tc.dir, c.Accountant, err, tc.want)
		}
	}
}

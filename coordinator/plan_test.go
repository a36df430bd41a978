package coordinator

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/seed"
)

// testPlan is a small valid plan: N = 10000, B = 100, σ calibrated to
// ε = 2 at δ = 1e-5 over 50 steps.
func testPlan() RunPlan {
	opt := dpadam.DefaultConfig()
	opt.ClipNorm = 1
	return RunPlan{
		Run: "plan", ModelSpec: []byte(`{}`), ModelHash: "h", Dim: 100, InitSeed: 1,
		DataExamples: 10000, BatchSize: 100, TargetEpsilon: 2, Delta: 1e-5, MaxSteps: 50,
		Optimizer: opt, NoiseMode: NoiseDiscrete,
	}
}

func TestRunPlanErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*RunPlan)
		want error
	}{
		{"N unknown", func(p *RunPlan) { p.DataExamples = 0 }, ErrInvalidPlan},
		{"N negative", func(p *RunPlan) { p.DataExamples, p.TotalExamples = 0, -5 }, ErrInvalidPlan},
		{"N contradicts the data", func(p *RunPlan) { p.TotalExamples = 9999 }, ErrInvalidPlan},
		{"B > N", func(p *RunPlan) { p.BatchSize = 10001 }, ErrInvalidPlan},
		{"B = 0", func(p *RunPlan) { p.BatchSize = 0 }, ErrInvalidPlan},
		{"B NaN", func(p *RunPlan) { p.BatchSize = math.NaN() }, ErrInvalidPlan},
		{"σ negative", func(p *RunPlan) { p.Sigma = -1 }, ErrInvalidPlan},
		{"σ NaN", func(p *RunPlan) { p.Sigma = math.NaN() }, ErrInvalidPlan},
		{"unknown noise mode", func(p *RunPlan) { p.NoiseMode = "gaussian" }, ErrInvalidPlan},
		{"legacy mode asked for by name", func(p *RunPlan) { p.NoiseMode = NoiseLegacy }, ErrInvalidPlan},
		{"calibration without steps", func(p *RunPlan) { p.MaxSteps = 0 }, ErrInvalidPlan},
		// Unreachable with σ ≤ 1e4 by either accountant: PLD certifies any ε
		// once the mechanism's total variation is below δ, RDP has a floor.
		{"target ε unreachable", func(p *RunPlan) { p.TargetEpsilon, p.Delta = 1e-6, 1e-12 }, accounting.ErrUnreachable},
		{"target ε negative", func(p *RunPlan) { p.TargetEpsilon = -1 }, accounting.ErrInvalidParameter},
		{"δ out of range", func(p *RunPlan) { p.Sigma, p.Delta = 1, 1 }, ErrInvalidPlan},
		{"δ negative", func(p *RunPlan) { p.Sigma, p.Delta = 1, -1e-5 }, ErrInvalidPlan},
		{"empty run name", func(p *RunPlan) { p.Run = "" }, ErrInvalidRunConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan()
			tc.edit(&p)
			c, err := p.RunConfig()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if c.Run != "" || c.Optimizer.NoiseMultiplier != 0 {
				t.Errorf("a refused plan returned a configuration: %+v", c)
			}
		})
	}
}

func TestRunPlanDerives(t *testing.T) {
	for _, tc := range []struct {
		name       string
		edit       func(*RunPlan)
		wantN      int64
		wantQ      float64
		wantSigma  float64 // 0: calibrated
		wantMode   string
		wantPolicy seed.Policy
	}{
		{"N from the data", func(*RunPlan) {}, 10000, 0.01, 0, NoiseDiscrete, seed.Crypto},
		{"N declared, no data", func(p *RunPlan) { p.DataExamples, p.TotalExamples = 0, 20000 }, 20000, 0.005, 0, NoiseDiscrete, seed.Crypto},
		{"N declared and equal to the data", func(p *RunPlan) { p.TotalExamples = 10000 }, 10000, 0.01, 0, NoiseDiscrete, seed.Crypto},
		{"B = N", func(p *RunPlan) { p.BatchSize = 10000; p.Sigma = 5 }, 10000, 1, 5, NoiseDiscrete, seed.Crypto},
		{"σ given", func(p *RunPlan) { p.Sigma = 1.5 }, 10000, 0.01, 1.5, NoiseDiscrete, seed.Crypto},
		{"σ given, no step limit", func(p *RunPlan) { p.Sigma, p.MaxSteps = 1.5, 0 }, 10000, 0.01, 1.5, NoiseDiscrete, seed.Crypto},
		{"float noise", func(p *RunPlan) { p.NoiseMode = NoiseFloat }, 10000, 0.01, 0, NoiseFloat, seed.Crypto},
		{"legacy kept whatever the mode says", func(p *RunPlan) { p.KeepLegacyNoise, p.NoiseMode = true, "bogus" }, 10000, 0.01, 0, NoiseLegacy, seed.Crypto},
		{"seeded", func(p *RunPlan) { p.Seeded = true }, 10000, 0.01, 0, NoiseDiscrete, seed.Seeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan()
			tc.edit(&p)
			c, err := p.RunConfig()
			if err != nil {
				t.Fatal(err)
			}
			if c.TotalExamples != tc.wantN || c.SampleRate != tc.wantQ || c.NoiseMode != tc.wantMode || c.SeedPolicy != tc.wantPolicy {
				t.Errorf("N %d q %v mode %q policy %q, want %d %v %q %q",
					c.TotalExamples, c.SampleRate, c.NoiseMode, c.SeedPolicy, tc.wantN, tc.wantQ, tc.wantMode, tc.wantPolicy)
			}
			if got, want := c.Optimizer.ExpectedBatchSize, c.SampleRate*float64(c.TotalExamples); got != want {
				t.Errorf("B = %v, want q·N = %v", got, want)
			}
			if tc.wantSigma != 0 && c.Optimizer.NoiseMultiplier != tc.wantSigma {
				t.Errorf("σ = %v, want %v", c.Optimizer.NoiseMultiplier, tc.wantSigma)
			}
			if tc.wantSigma == 0 && !(c.Optimizer.NoiseMultiplier > 0) {
				t.Errorf("σ = %v was not calibrated", c.Optimizer.NoiseMultiplier)
			}
		})
	}
}

// TestRunPlanMarginOnce: the calibrated σ spends at most
// TargetEpsilon·(1 − CalibrationMargin) over MaxSteps, and it is the σ that
// the RDP accountant's Calibrate gives for exactly that target with the run's own event:
// the margin is applied once, and the calibration charges what the ledger
// will charge.
func TestRunPlanMarginOnce(t *testing.T) {
	for _, mode := range []string{NoiseDiscrete, NoiseFloat} {
		p := testPlan()
		p.NoiseMode, p.Accountant = mode, AccountantRDP
		c, err := p.RunConfig()
		if err != nil {
			t.Fatal(err)
		}
		eps, _, err := accounting.RDP{}.EpsilonOrder(c.Event(), p.MaxSteps, p.Delta)
		if err != nil || eps > p.TargetEpsilon*(1-CalibrationMargin) {
			t.Errorf("%s: ε after %d steps = %v (%v), above the target less the margin %v", mode, p.MaxSteps, eps, err, p.TargetEpsilon*(1-CalibrationMargin))
		}
		event := func(sigma float64) accounting.Event {
			c := c
			c.Optimizer.NoiseMultiplier = sigma
			return c.Event()
		}
		once, err := accounting.RDP{}.Calibrate(p.TargetEpsilon*(1-CalibrationMargin), p.MaxSteps, p.Delta, event)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Optimizer.NoiseMultiplier; got != once {
			t.Errorf("%s: σ = %v, want %v (the margin applied once)", mode, got, once)
		}
	}
}

// TestRunPlanPLD: a new run gets PLD by default, float or discrete noise,
// and its σ is the PLD calibration's for TargetEpsilon·(1 −
// CalibrationMargin) (the margin applied once) with the event the ledger
// will charge: its PLD ε over MaxSteps is within that, and it is below the
// RDP-calibrated σ (PLD is tighter). An unknown accountant is an error.
func TestRunPlanPLD(t *testing.T) {
	p := testPlan()
	p.NoiseMode = NoiseFloat
	c, err := p.RunConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.Accountant != AccountantPLD {
		t.Fatalf("float run's default accountant = %q, want %q", c.Accountant, AccountantPLD)
	}
	sigma := c.Optimizer.NoiseMultiplier
	once, err := accounting.PLD{}.Calibrate(p.TargetEpsilon*(1-CalibrationMargin), p.MaxSteps, p.Delta, func(s float64) accounting.Event { return accounting.SubsampledGaussian(c.SampleRate, s) })
	if err != nil || sigma != once {
		t.Errorf("σ = %v, want PLD Calibrate's %v (%v)", sigma, once, err)
	}
	eps, err := accounting.PLD{}.Epsilon(accounting.SubsampledGaussian(c.SampleRate, sigma), p.MaxSteps, p.Delta)
	if err != nil || eps > p.TargetEpsilon*(1-CalibrationMargin) {
		t.Errorf("PLD ε after %d steps = %v (%v), above the target less the margin", p.MaxSteps, eps, err)
	}
	p.Accountant = AccountantRDP
	r, err := p.RunConfig()
	if err != nil {
		t.Fatal(err)
	}
	if r.Accountant != AccountantRDP || !(sigma < r.Optimizer.NoiseMultiplier) {
		t.Errorf("RDP run: accountant %q, σ %v; want rdp and σ above PLD's %v", r.Accountant, r.Optimizer.NoiseMultiplier, sigma)
	}

	// Discrete noise (the default) gets PLD too, calibrated for the event
	// the ledger charges: the snapped sum's σ_eff with its lattice. Its PLD
	// ε is within the target less the margin, its σ is below the RDP
	// run's, and an RDP discrete run keeps the event without a lattice.
	d := testPlan()
	dc, err := d.RunConfig()
	if err != nil || dc.Accountant != AccountantPLD {
		t.Fatalf("discrete run: accountant %q (%v), want %q", dc.Accountant, err, AccountantPLD)
	}
	ev := dc.Event()
	if ev.Event == nil || ev.Event.Kind != accounting.KindDiscreteGaussian || ev.Event.Dimension != int64(dc.Dim) ||
		!(ev.Event.LatticeScale >= dc.Optimizer.NoiseMultiplier*65536*math.Sqrt(float64(dc.Dim))) {
		t.Fatalf("discrete PLD run charges %+v, want the discrete Gaussian with its lattice", ev.Event)
	}
	dEvent := func(sigma float64) accounting.Event {
		c := dc
		c.Optimizer.NoiseMultiplier = sigma
		return c.Event()
	}
	once, err = accounting.PLD{}.Calibrate(p.TargetEpsilon*(1-CalibrationMargin), p.MaxSteps, p.Delta, dEvent)
	if err != nil || dc.Optimizer.NoiseMultiplier != once {
		t.Errorf("discrete σ = %v, want PLD Calibrate's %v (%v)", dc.Optimizer.NoiseMultiplier, once, err)
	}
	if eps, err := (accounting.PLD{}).EpsilonSteps([]accounting.PLDEvent{{SampleRate: dc.SampleRate, NoiseMultiplier: ev.Event.NoiseMultiplier,
		Count: p.MaxSteps, Dimension: ev.Event.Dimension, LatticeScale: ev.Event.LatticeScale}}, p.Delta); err != nil || eps > p.TargetEpsilon*(1-CalibrationMargin) {
		t.Errorf("discrete PLD ε after %d steps = %v (%v), above the target less the margin", p.MaxSteps, eps, err)
	}
	d.Accountant = AccountantRDP
	dr, err := d.RunConfig()
	if err != nil || !(dc.Optimizer.NoiseMultiplier < dr.Optimizer.NoiseMultiplier) {
		t.Errorf("discrete RDP run: σ %v (%v), want above PLD's %v", dr.Optimizer.NoiseMultiplier, err, dc.Optimizer.NoiseMultiplier)
	}
	if e := dr.Event(); e.Event == nil || e.Event.Dimension != 0 || e.Event.LatticeScale != 0 {
		t.Errorf("discrete RDP run charges %+v, want the event without a lattice", e)
	}
	d.Accountant = "moments"
	if _, err := d.RunConfig(); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("unknown accountant: %v, want ErrInvalidPlan", err)
	}
	l := testPlan()
	l.NoiseMode, l.Accountant, l.KeepLegacyAccountant = NoiseFloat, AccountantPLD, true
	lc, err := l.RunConfig()
	if err != nil || lc.Accountant != AccountantLegacy {
		t.Errorf("legacy accountant kept: %q (%v), want %q", lc.Accountant, err, AccountantLegacy)
	}
}

// TestRunPlanDeterministic: the same plan gives the same configuration.
func TestRunPlanDeterministic(t *testing.T) {
	a, err := testPlan().RunConfig()
	if err != nil {
		t.Fatal(err)
	}
	b, err := testPlan().RunConfig()
	if err != nil {
		t.Fatal(err)
	}
	if a.Optimizer != b.Optimizer || a.SampleRate != b.SampleRate {
		t.Errorf("two derivations differ: %+v, %+v", a.Optimizer, b.Optimizer)
	}
}

// TestRunPlanNodeConfig: a node's configuration is the run's, but σ is
// kept when given and neither calibrated nor known when not.
func TestRunPlanNodeConfig(t *testing.T) {
	p := testPlan()
	p.TargetEpsilon = 1e-6 // unreachable: calibrating would fail
	got, err := p.NodeConfig()
	if err != nil {
		t.Fatal(err)
	}
	p.Sigma = 1
	want, err := p.RunConfig()
	if err != nil {
		t.Fatal(err)
	}
	want.Optimizer.NoiseMultiplier = 0
	if diff := ConfigDiff(got, want); len(diff) != 0 {
		t.Errorf("NodeConfig differs from RunConfig less σ: %v", diff)
	}
	p.Sigma = 2
	if got, err := p.NodeConfig(); err != nil || got.Optimizer.NoiseMultiplier != 2 {
		t.Errorf("NodeConfig with σ = 2: σ = %v, %v; want 2", got.Optimizer.NoiseMultiplier, err)
	}
	p.BatchSize = 0
	if _, err := p.NodeConfig(); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("NodeConfig of a bad plan: %v, want ErrInvalidPlan", err)
	}
}

// fakeModel is an Initializer whose θ₀ is the seed in every parameter.
type fakeModel struct{ hash string }

func (m fakeModel) Hash() string   { return m.hash }
func (m fakeModel) NumParams() int { return 3 }
func (m fakeModel) Init(theta []float32, seed uint64) error {
	for i := range theta {
		theta[i] = float32(seed)
	}
	return nil
}

func TestTheta0(t *testing.T) {
	c := RunConfig{ModelSpec: []byte("spec"), ModelHash: "h", InitSeed: 7}
	init := InitFromSpec(func(spec []byte) (Initializer, error) {
		if string(spec) != "spec" {
			t.Errorf("built from %q, want the run's spec", spec)
		}
		return fakeModel{hash: "h"}, nil
	})
	theta, err := init(c)
	if err != nil || len(theta) != 3 || theta[0] != 7 || theta[2] != 7 {
		t.Errorf("θ₀ = %v, %v; want [7 7 7]", theta, err)
	}
	if _, err := c.Theta0(fakeModel{hash: "other"}); err == nil {
		t.Error("θ₀ of a model that is not the run's: no error")
	}
}

// TestRunPlanDelta: δ must be below 1/N; without one the plan derives
// 1e-5 below N = 1e5 (the δ every run had before) and the largest power
// of ten at most 1/(10·N) from there, and a resumed run keeps its ledger's δ.
func TestRunPlanDelta(t *testing.T) {
	for _, tc := range []struct {
		name          string
		n             int64
		delta, ledger float64
		want          float64 // 0: refused
	}{
		{"default, small N", 10000, 0, 0, 1e-5},
		{"default, N just below 1e5", 99999, 0, 0, 1e-5},
		{"default, N = 1e5", 100000, 0, 0, 1e-6},
		{"default, N just above 1e5", 100001, 0, 0, 1e-7},
		{"default, fortunes-seq", 133080, 0, 0, 1e-7},
		{"default, N = 1e6", 1000000, 0, 0, 1e-7},
		{"default, N just above 1e6", 1000001, 0, 0, 1e-8},
		{"given", 10000, 1e-6, 0, 1e-6},
		{"given, just below 1/N", 10000, 0.99e-4, 0, 0.99e-4},
		{"given over the ledger's", 10000, 1e-6, 1e-5, 1e-6},
		{"resumed at δ ≥ 1/N", 133080, 0, 1e-5, 1e-5},
		{"δ = 1/N", 10000, 1e-4, 0, 0},
		{"δ = 0.5", 3000, 0.5, 0, 0},
		{"1e-5 given with N > 1e5", 133080, 1e-5, 0, 0},
		{"given at δ ≥ 1/N, resumed", 133080, 1e-5, 1e-5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan()
			p.DataExamples, p.Sigma, p.Delta, p.LedgerDelta = tc.n, 1, tc.delta, tc.ledger
			c, err := p.RunConfig()
			switch {
			case tc.want == 0 && err == nil:
				t.Fatalf("δ = %v accepted with N = %d", c.Delta, tc.n)
			case tc.want == 0:
				if !errors.Is(err, ErrInvalidPlan) {
					t.Fatalf("err = %v, want ErrInvalidPlan", err)
				}
				for _, want := range []string{fmt.Sprintf("delta %g", tc.delta), fmt.Sprintf("N = %d", tc.n), "1/N = "} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			case err != nil:
				t.Fatal(err)
			case c.Delta != tc.want:
				t.Errorf("δ = %v, want %v", c.Delta, tc.want)
			case tc.ledger == 0 && !(c.Delta < 1/float64(tc.n)):
				t.Errorf("δ = %v is not below 1/N = %v", c.Delta, 1/float64(tc.n))
			}
		})
	}
}

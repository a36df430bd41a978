package ledger

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// mainJobEvent is one step of the README's main job (mlp, q = 256/60000,
// discrete noise on the leader's lattice for d = 269322), at σ calibrated
// with the PLD accountant to ε = 3 at δ = 1e-5 over 1000 steps.
func mainJobEvent(t testing.TB) (accounting.Event, float64) {
	t.Helper()
	const q, d, steps, target, delta = 256.0 / 60000, 269322, 1000, 3.0, 1e-5
	// The leader's lattice scale for C = 1 (mechanism.GridFraction):
	// s = σ·(2¹⁶+1)·√d, as DiscreteGaussianLattice's callers compute it.
	event := func(sigma float64) accounting.Event {
		return accounting.PoissonSampled(q, accounting.DiscreteGaussianLattice(sigma, sigma*(1<<16+1)*math.Sqrt(d), d))
	}
	sigma, err := accounting.PLD{}.Calibrate(target, steps, delta, event)
	if err != nil {
		t.Fatal(err)
	}
	return event(sigma), target
}

// TestPLDLedgerRecordsStepsTaken: a PLD ledger records, after every step
// n, the accountant's ε of exactly n steps, up to the grid's rounding up:
// within [1, PLDGridRatio] × the PLD accountant's Epsilon(n), never the plan's ε. The
// run is the README's main job; the recorded ε at 1, 10, 100, 300 and
// 1000 steps are logged (docs/PRIVACY.md's table). Before, step 1 recorded
// the RDP bound (2.26 against a PLD ε of 0.50) and every step from about
// 60 on the plan's ε, 3.
func TestPLDLedgerRecordsStepsTaken(t *testing.T) {
	e, target := mainJobEvent(t)
	const delta = 1e-5
	l, err := Open(filepath.Join(t.TempDir(), "ledger.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Start("main", target, delta, seed.Crypto, MechanismDiscrete, AccountantPLD, testHistory); err != nil {
		t.Fatal(err)
	}
	l.PlanSteps(1000)
	var recorded []float64
	for step := int64(1); step <= 1000; step++ {
		r, err := l.Charge(step, e, at(1, uint64(step)), false)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if l.Spent() != r.Epsilon {
			t.Fatalf("step %d: Spent %v, recorded %v", step, l.Spent(), r.Epsilon)
		}
		recorded = append(recorded, r.Epsilon)
	}
	check := func(n int) {
		exact, err := accounting.PLD{}.Epsilon(e, int64(n), delta)
		if err != nil {
			t.Fatal(err)
		}
		got := recorded[n-1]
		if got < exact || got > exact*PLDGridRatio {
			t.Errorf("after %d steps recorded ε=%.6g, the accountant's ε(%d) = %.6g: ratio %.5f, want within [1, %v]", n, got, n, exact, got/exact, PLDGridRatio)
		}
		if n == 1 || n == 10 || n == 100 || n == 300 || n == 1000 {
			t.Logf("n = %4d: recorded %.6f, accountant %.6f (ratio %.5f)", n, got, exact, got/exact)
		}
	}
	for n := 1; n <= 40; n++ {
		check(n)
	}
	for n := 41; n < 1000; n += 29 {
		check(n)
	}
	for _, n := range []int{63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 300, 511, 512, 513, 999, 1000} {
		check(n) // the buckets' edges (pldShape) and the table's counts
	}
	if exact, _ := (accounting.PLD{}).Epsilon(e, 1000, delta); recorded[999] != exact {
		t.Errorf("at the step limit recorded %v, want the accountant's ε exactly, %v", recorded[999], exact)
	}
	if over, err := l.WouldExceed(e); err != nil || !over {
		t.Errorf("after 1000 steps WouldExceed = %v, %v; want true", over, err)
	}
	for i := 1; i < len(recorded); i++ {
		if recorded[i] < recorded[i-1] {
			t.Errorf("recorded ε fell from %v to %v at step %d", recorded[i-1], recorded[i], i+1)
		}
	}
	// Replay, from the run record alone, gives every value bit for bit.
	run, _ := l.Run()
	rp, err := NewReplay(run)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range recorded {
		if got, err := rp.Charge(e); err != nil || got != want {
			t.Fatalf("Replay after %d charges: %v (%v), recorded %v", i+1, got, err, want)
		}
	}
}

// BenchmarkPLDLedgerMainJob charges the README's main job's 1000 steps to
// a PLD ledger, warming nothing ahead: every grid count is evaluated on the
// charging goroutine. It reports the grid's evaluations per run.
func BenchmarkPLDLedgerMainJob(b *testing.B) {
	e, target := mainJobEvent(b)
	for range b.N {
		accounting.ResetCaches()
		l, err := Open(filepath.Join(b.TempDir(), "ledger.log"))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Start("main", target, 1e-5, seed.Crypto, MechanismDiscrete, AccountantPLD, testHistory); err != nil {
			b.Fatal(err)
		}
		l.PlanSteps(1000)
		for step := int64(1); step <= 1000; step++ {
			if _, err := l.Charge(step, e, at(1, uint64(step)), false); err != nil {
				b.Fatal(err)
			}
		}
		for _, s := range l.budget.(*pldBudget).series {
			b.ReportMetric(float64(len(s.evals)), "evals/run")
			b.ReportMetric(float64(len(s.counts)), "grid/run")
		}
		l.Close()
	}
}

// TestLedgerWarmsNextGridCount: after a charge the ledger's own goroutine
// computes the grid count the next charge needs, so that charge does no
// PLD evaluation itself; Close stops and waits for it.
func TestLedgerWarmsNextGridCount(t *testing.T) {
	l, _ := newPLDLedger(t, 5)
	e := accounting.SubsampledGaussian(testQ, testSigma)
	for step := int64(1); step <= 3; step++ {
		if _, err := l.Charge(step, e, at(1, uint64(step)), false); err != nil {
			t.Fatal(err)
		}
		l.warming.Wait()
		s, err := accounting.PLDStep(e)
		if err != nil {
			t.Fatal(err)
		}
		if ser := l.budget.(*pldBudget).seriesOf(keyOf(s)); !ser.covers(step + 1) {
			t.Errorf("after charge %d the grid does not reach %d", step, step+1)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPrewarmSameGrid: prewarming a ledger (the step limit and the grid's
// dense start, evaluated on several goroutines) gives the very grid, bit
// for bit, that charging one step at a time builds, and covers the dense
// start before the first charge.
func TestPrewarmSameGrid(t *testing.T) {
	e, target := mainJobEvent(t)
	s, err := accounting.PLDStep(e)
	if err != nil {
		t.Fatal(err)
	}
	grid := func(prewarm bool) *pldSeries {
		accounting.ResetCaches()
		l, err := Open(filepath.Join(t.TempDir(), "ledger.log"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.Start("main", target, 1e-5, seed.Crypto, MechanismDiscrete, AccountantPLD, testHistory); err != nil {
			t.Fatal(err)
		}
		l.PlanSteps(1000)
		ser := l.budget.(*pldBudget).seriesOf(keyOf(s))
		if prewarm {
			l.Prewarm(e)
			l.warming.Wait()
			if m := len(ser.counts); m < 32 || ser.counts[m-1]-ser.counts[m-2] < 2 {
				t.Errorf("after Prewarm the grid has not left its dense start: %v", ser.counts)
			}
		}
		if _, err := ser.epsilon(200); err != nil {
			t.Fatal(err)
		}
		return ser
	}
	plain, warmed := grid(false), grid(true)
	if !slices.Equal(plain.counts, warmed.counts) || !slices.Equal(plain.eps, warmed.eps) || plain.limit != warmed.limit {
		t.Errorf("prewarmed grid differs:\n%v\n%v", plain.counts, warmed.counts)
	}
}

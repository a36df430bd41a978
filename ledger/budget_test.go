package ledger

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// newPLDLedger opens a ledger in a temp dir and starts a float-noise run
// that enforces its budget with the PLD accountant.
func newPLDLedger(t *testing.T, target float64) (*Ledger, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := l.Start("pld-run", target, 1e-5, seed.Crypto, MechanismFloat, AccountantPLD, testHistory); err != nil {
		t.Fatal(err)
	}
	return l, path
}

// TestLedgerPLDEnforcesBudget: a PLD run takes exactly the steps whose PLD
// ε is within the target (the target here is the PLD ε of 40 steps, and
// 41 steps exceed it), every recorded ε is an upper bound on the exact
// PLD ε of the steps so far and within the target, the last is exact, and
// a reopened ledger and the audit agree with it.
func TestLedgerPLDEnforcesBudget(t *testing.T) {
	const delta, limit = 1e-5, 40
	target, err := accounting.PLD{}.Epsilon(accounting.SubsampledGaussian(testQ, testSigma), limit, delta)
	if err != nil {
		t.Fatal(err)
	}
	if next, err := (accounting.PLD{}).Epsilon(accounting.SubsampledGaussian(testQ, testSigma), limit+1, delta); err != nil || !(next > target) {
		t.Fatalf("precondition: ε(%d) = %v (%v) is not above ε(%d) = %v", limit+1, next, err, limit, target)
	}
	l, path := newPLDLedger(t, target)
	if l.Accountant() != AccountantPLD {
		t.Fatalf("Accountant() = %q", l.Accountant())
	}
	e := accounting.SubsampledGaussian(testQ, testSigma)
	var recs []Record
	for step := int64(1); ; step++ {
		exceed, err := l.WouldExceed(e)
		if err != nil {
			t.Fatal(err)
		}
		r, err := l.Charge(step, e, at(1, uint64(step+10)), false)
		if exceed != (err != nil) {
			t.Fatalf("step %d: WouldExceed %v but Charge returned %v", step, exceed, err)
		}
		if err != nil {
			if !errors.Is(err, ErrBudgetExceeded) {
				t.Fatalf("step %d: %v, want ErrBudgetExceeded", step, err)
			}
			break
		}
		recs = append(recs, r)
		if r.Epsilon > target || r.Epsilon != l.Spent() {
			t.Fatalf("step %d: recorded ε=%v, Spent %v, target %v", step, r.Epsilon, l.Spent(), target)
		}
	}
	if len(recs) != limit {
		t.Fatalf("charged %d steps, want %d", len(recs), limit)
	}
	for _, n := range []int{1, 8, 13, 33, limit} {
		exact, err := accounting.PLD{}.Epsilon(accounting.SubsampledGaussian(testQ, testSigma), int64(n), delta)
		if err != nil {
			t.Fatal(err)
		}
		rdp, _, err := accounting.RDP{}.EpsilonOrder(accounting.SubsampledGaussian(testQ, testSigma), int64(n), delta)
		if err != nil {
			t.Fatal(err)
		}
		got := recs[n-1].Epsilon
		if got < exact || got > rdp || n == limit && got != exact {
			t.Errorf("after %d steps recorded ε=%v, exact PLD ε=%v, RDP ε=%v (must be between, and exact at the limit)", n, got, exact, rdp)
		}
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Epsilon < recs[i-1].Epsilon {
			t.Errorf("recorded ε decreased from %v to %v at step %d", recs[i-1].Epsilon, recs[i].Epsilon, i+1)
		}
	}
	spent := l.Spent()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if l2.Spent() != spent || l2.Accountant() != AccountantPLD || l2.Charges() != limit {
		t.Errorf("reopened: Spent %v (want %v), accountant %q, charges %d", l2.Spent(), spent, l2.Accountant(), l2.Charges())
	}
	if exceed, err := l2.WouldExceed(e); err != nil || !exceed {
		t.Errorf("reopened WouldExceed = %v, %v; want true", exceed, err)
	}
	if err := l2.Start("pld-run", target, delta, seed.Crypto, MechanismFloat, AccountantRDP, testHistory); !errors.Is(err, ErrRunMismatch) {
		t.Errorf("Start with another accountant: %v, want ErrRunMismatch", err)
	}
	rep, err := Audit(path)
	if err != nil || !rep.OK {
		t.Fatalf("audit: %v %+v", err, rep)
	}
	rdp, _, err := accounting.RDP{}.EpsilonOrder(accounting.SubsampledGaussian(testQ, testSigma), limit, delta)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Accountant != AccountantPLD || rep.RecomputedEpsilon != spent || rep.PLDEpsilon == nil ||
		*rep.PLDEpsilon != target || rep.RDPEpsilon != rdp || !(rep.RDPEpsilon > target) {
		t.Errorf("audit: accountant %q, recomputed %v (want %v), PLD %v (want %v), RDP %v (want %v > PLD)",
			rep.Accountant, rep.RecomputedEpsilon, spent, rep.PLDEpsilon, target, rep.RDPEpsilon, rdp)
	}
}

// TestLedgerPLDDiscrete: a discrete-noise run can start with the PLD
// accountant and is charged with its lattice events (ε is accounting.PLD.EpsilonSteps'
// of the discrete events, above the continuous Gaussian's at the same σ);
// a discrete event that names no lattice (what an RDP run charges) is
// refused and recorded nowhere, and so is an unknown accountant.
func TestLedgerPLDDiscrete(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "ledger.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Start("r", 3, 1e-5, seed.Crypto, MechanismFloat, "moments", testHistory); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("unknown accountant: %v, want ErrInvalidParameter", err)
	}
	if _, n := l.Head(); n != 0 {
		t.Fatalf("refused start recorded %d records", n)
	}
	if err := l.Start("r", 3, 1e-5, seed.Crypto, MechanismDiscrete, AccountantPLD, testHistory); err != nil {
		t.Fatalf("PLD with discrete noise: %v", err)
	}
	bare := accounting.SubsampledDiscreteGaussian(testQ, testSigma)
	if _, err := l.Charge(1, bare, at(1, 5), false); !errors.Is(err, accounting.ErrInvalidEvent) {
		t.Errorf("discrete event without a lattice on a PLD run: %v, want ErrInvalidEvent", err)
	}
	if exceed, err := l.WouldExceed(bare); !errors.Is(err, accounting.ErrInvalidEvent) || exceed {
		t.Errorf("WouldExceed of a discrete event without a lattice: %v, %v", exceed, err)
	}
	if l.Charges() != 0 || l.Spent() != 0 {
		t.Fatalf("refused charge left %d charges, ε=%v", l.Charges(), l.Spent())
	}
	const scale, dim = 1 << 20, 1000
	lattice := accounting.PoissonSampled(testQ, accounting.DiscreteGaussianLattice(testSigma, scale, dim))
	for i := range 3 {
		if _, err := l.Charge(int64(i+1), lattice, at(1, uint64(i+5)), false); err != nil {
			t.Fatal(err)
		}
	}
	want, err := accounting.PLD{}.EpsilonSteps([]accounting.PLDEvent{{SampleRate: testQ, NoiseMultiplier: testSigma, Count: 3, Dimension: dim, LatticeScale: scale}}, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	cont, err := accounting.PLD{}.Epsilon(accounting.SubsampledGaussian(testQ, testSigma), 3, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	rdp, _, err := accounting.RDP{}.EpsilonOrder(bare, 3, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	// Spent is the PLD ε of the discrete events at 3 steps (a grid count:
	// every count is one while ε grows by more than PLDGridRatio a step),
	// below the discrete RDP bound and above the continuous Gaussian's.
	if got := l.Spent(); got > rdp || got != want || want < cont {
		t.Errorf("Spent %v: want PLD %v, below RDP %v, PLD at least the continuous Gaussian's %v", got, want, rdp, cont)
	}
}

// TestLedgerPLDMixedSteps: steps with different (q, σ) fall back to
// composing every event, so ε is accounting.PLD.EpsilonSteps' exactly, and the budget
// check agrees with it.
func TestLedgerPLDMixedSteps(t *testing.T) {
	const delta = 1e-5
	l, _ := newPLDLedger(t, 1)
	a, b := accounting.SubsampledGaussian(testQ, testSigma), accounting.SubsampledGaussian(2*testQ, 2*testSigma)
	for i, e := range []accounting.Event{a, a, b, a, b} {
		if _, err := l.Charge(int64(i+1), e, at(1, uint64(i+10)), false); err != nil {
			t.Fatal(err)
		}
	}
	evs := []accounting.PLDEvent{{SampleRate: testQ, NoiseMultiplier: testSigma, Count: 3}, {SampleRate: 2 * testQ, NoiseMultiplier: 2 * testSigma, Count: 2}}
	want, err := accounting.PLD{}.EpsilonSteps(evs, delta)
	if err != nil || l.Spent() != want {
		t.Errorf("Spent %v, want EpsilonSteps' %v (%v)", l.Spent(), want, err)
	}
	big := accounting.SubsampledGaussian(0.5, 0.7)
	next, err := accounting.PLD{}.EpsilonSteps(append(evs, accounting.PLDEvent{SampleRate: 0.5, NoiseMultiplier: 0.7, Count: 1}), delta)
	if err != nil {
		t.Fatal(err)
	}
	exceed, err := l.WouldExceed(big)
	if err != nil || exceed != (next > 1) || !exceed {
		t.Errorf("WouldExceed = %v (%v); ε with it would be %v, target 1", exceed, err, next)
	}
}

// BenchmarkLedgerWouldExceedPLD is the state machine's per-step work on
// a PLD run of identical steps once the step limit is known: the budget
// check (WouldExceed) and the status report (Spent). The one-time search
// for the step limit is BenchmarkLedgerPLDStepLimit; a T-step run costs
// this per step plus that once.
func BenchmarkLedgerWouldExceedPLD(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "ledger.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	if err := l.Start("bench", 3, 1e-5, seed.Crypto, MechanismFloat, AccountantPLD, testHistory); err != nil {
		b.Fatal(err)
	}
	e := accounting.SubsampledGaussian(256.0/60000, 0.8)
	for i := range 100 {
		if _, err := l.Charge(int64(i+1), e, at(1, uint64(i+10)), false); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		if over, err := l.WouldExceed(e); err != nil || over {
			b.Fatal(over, err)
		}
		if l.Spent() <= 0 {
			b.Fatal("no ε")
		}
	}
}

// BenchmarkLedgerPLDStepLimit is the one-time cost of a PLD run's budget
// check: finding the largest step count within the target (the README's
// main job shape: q = 256/60000, ε = 3, δ = 1e-5, σ = 0.8).
func BenchmarkLedgerPLDStepLimit(b *testing.B) {
	for range b.N {
		accounting.ResetCaches() // time the computation, not the memo
		bud, err := newBudget(AccountantPLD, 1e-5, 3)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := exceeds(bud, accounting.SubsampledGaussian(256.0/60000, 0.8), 3); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPLDPlannedStepsSameLimit: the planned step count only moves where the
// step-limit search starts: the limit is the same as without it, and for a
// σ calibrated to the planned count the search takes at most three PLD
// evaluations (the planned count, its neighbour, and nothing more when
// the calibration's margin puts the limit there).
func TestPLDPlannedStepsSameLimit(t *testing.T) {
	const q, delta, target = 256.0 / 60000, 1e-5, 3.0
	for _, planned := range []int64{300, 1000} {
		sigma, err := accounting.PLD{}.Calibrate(target*(1-1e-9), planned, delta, func(s float64) accounting.Event { return accounting.SubsampledGaussian(q, s) })
		if err != nil {
			t.Fatal(err)
		}
		e := accounting.SubsampledGaussian(q, sigma)
		limit := func(hint int64) (int64, int) {
			b, err := newBudget(AccountantPLD, delta, target)
			if err != nil {
				t.Fatal(err)
			}
			pb := b.(*pldBudget)
			pb.planned = hint
			s, err := accounting.PLDStep(e)
			if err != nil {
				t.Fatal(err)
			}
			ser := pb.seriesOf(keyOf(s))
			got, err := ser.stepLimit()
			if err != nil {
				t.Fatal(err)
			}
			return got, len(ser.evals)
		}
		plain, plainEvals := limit(0)
		hinted, hintedEvals := limit(planned)
		if hinted != plain {
			t.Errorf("planned %d: limit %d with the plan, %d without", planned, hinted, plain)
		}
		if hinted < planned {
			t.Errorf("planned %d: limit %d below the count σ was calibrated for", planned, hinted)
		}
		if hintedEvals > 3 {
			t.Errorf("planned %d: %d PLD evaluations with the plan (%d without), want at most 3", planned, hintedEvals, plainEvals)
		}
		t.Logf("planned %d: T* = %d; %d evaluations with the plan, %d without", planned, hinted, hintedEvals, plainEvals)
	}
}

// BenchmarkLedgerPLDStepLimitPlanned is BenchmarkLedgerPLDStepLimit for a
// run that planned its steps (PlanSteps): σ calibrated for 1000 steps.
func BenchmarkLedgerPLDStepLimitPlanned(b *testing.B) {
	const q, delta, target, steps = 256.0 / 60000, 1e-5, 3.0, 1000
	sigma, err := accounting.PLD{}.Calibrate(target*(1-1e-9), steps, delta, func(s float64) accounting.Event { return accounting.SubsampledGaussian(q, s) })
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		accounting.ResetCaches() // time the computation, not the memo
		bud, err := newBudget(AccountantPLD, delta, target)
		if err != nil {
			b.Fatal(err)
		}
		bud.(*pldBudget).planned = steps
		if _, err := exceeds(bud, accounting.SubsampledGaussian(q, sigma), target); err != nil {
			b.Fatal(err)
		}
	}
}

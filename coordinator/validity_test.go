package coordinator

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
)

// TestFSMChargesConfigEvent is issue 11 item 4: a step entry carrying
// another event than the run configuration's (here q = 1e-9, which would
// make the charge almost free) is refused: not charged, not applied, not
// fatal. The ledger only ever records the configuration's event.
func TestFSMChargesConfigEvent(t *testing.T) {
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	c := testRunConfig()
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	grads := noisyGrads(2, 31)
	mustApply(t, f, stepLog(t, 2, 1, c, grads[0]))

	cheap := c
	cheap.SampleRate = 1e-9
	res := mustApply(t, f, stepLog(t, 3, 2, cheap, grads[1]))
	if res.Charged || res.Applied || !errors.Is(res.Err, ErrEventMismatch) || errors.Is(res.Err, ErrFatal) {
		t.Errorf("entry with event q=1e-9: %+v, want refused (ErrEventMismatch) without a charge, not fatal", res)
	}
	if s := f.State(); s.Fatal != nil || s.Applied != 1 || s.Charges != 1 || s.Stopped == "" {
		t.Errorf("state after the refused entry: %+v, want step 1 applied and charged only, the run stopped", s)
	}
	// Replaying the same entries (a restart) gives the same answers.
	g := newTestFSM(t, t.TempDir())
	mustApply(t, g, logEntry(t, 1, entryConfig, c))
	mustApply(t, g, stepLog(t, 2, 1, c, grads[0]))
	if res := mustApply(t, g, stepLog(t, 3, 2, cheap, grads[1])); res.Charged || res.Applied || !errors.Is(res.Err, ErrEventMismatch) {
		t.Errorf("second replica: %+v", res)
	}
	da, _ := f.Digest()
	if db, _ := g.Digest(); da != db {
		t.Error("replicas disagree after the refused entry")
	}
	recs, _, err := ledger.ReadFile(filepath.Join(dir, LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Kind == ledger.RecordCharge && r.Event.SampleRate != c.SampleRate {
			t.Errorf("ledger record %d charges q=%v, the run's q is %v", r.Seq, r.Event.SampleRate, c.SampleRate)
		}
	}
}

// TestFSMRefusesInvalidGradient: a g̃ that dpadam would refuse (NaN, ±Inf,
// |g̃ᵢ| ≥ MaxGradient) is refused before the charge: not charged, not
// applied, and not fatal (before the fix, a finite g̃ of 2^63 was charged
// and then failed the optimizer on every replica). The largest float32
// below MaxGradient is a valid g̃.
func TestFSMRefusesInvalidGradient(t *testing.T) {
	below := math.Nextafter32(float32(dpadam.MaxGradient), 0)
	for _, tc := range []struct {
		name  string
		x     float32
		valid bool
	}{
		{"NaN", float32(math.NaN()), false},
		{"+Inf", float32(math.Inf(1)), false},
		{"-Inf", float32(math.Inf(-1)), false},
		{"2^63", float32(dpadam.MaxGradient), false},
		{"-2^63", -float32(dpadam.MaxGradient), false},
		{"below 2^63", below, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFSM(t, t.TempDir())
			c := testRunConfig()
			mustApply(t, f, logEntry(t, 1, entryConfig, c))
			g := noisyGrads(1, 32)[0]
			g[5] = tc.x
			res := mustApply(t, f, stepLog(t, 2, 1, c, g))
			if tc.valid {
				if !res.Applied || !res.Charged || res.Err != nil {
					t.Fatalf("valid g̃: %+v", res)
				}
				return
			}
			if res.Charged || res.Applied || !errors.Is(res.Err, dpadam.ErrNonFinite) || errors.Is(res.Err, ErrFatal) {
				t.Errorf("g̃ with %v: %+v, want refused (ErrNonFinite) without a charge, not fatal", tc.x, res)
			}
			if s := f.State(); s.Fatal != nil || s.Charges != 0 || s.Applied != 0 || s.Stopped == "" {
				t.Errorf("state: %+v, want nothing charged or applied, the run stopped", s)
			}
			// The stopped run applies nothing more; a valid entry after
			// it is still charged (its g̃ is committed).
			res = mustApply(t, f, stepLog(t, 3, 1, c, noisyGrads(1, 33)[0]))
			if res.Applied || !res.Charged || !errors.Is(res.Err, ErrStopped) {
				t.Errorf("step after the refusal: %+v", res)
			}
		})
	}
}

// TestServerChecksGradientBeforeProposing: a clip norm so large that g̃
// exceeds MaxGradient (an operator mistake). The leader checks g̃ with the
// optimizer's rule before proposing: no g̃ is proposed or released, and
// the run stops with the reason, instead of every replica failing. Step 1
// was charged while its round ran, and stays charged, not applied
// (over-count, never under-count).
func TestServerChecksGradientBeforeProposing(t *testing.T) {
	dir := t.TempDir()
	c := testRunConfig()
	c.Optimizer.ClipNorm = 1e25
	c.MaxSteps = 5
	sum, err := runOneScriptedNode(t, dir, c, 9)
	if err != nil {
		t.Fatalf("Run = %v (summary %+v), want the run stopped without an error", err, sum)
	}
	// The leader stopped the run itself (the state machine would also
	// refuse the entry, but then a g̃ would have been committed).
	if sum.Steps != 0 || sum.Charges != 1 || !strings.Contains(sum.Stopped, "not proposed") {
		t.Errorf("summary %+v, want no step, step 1's charge, stopped by the leader before proposing", sum)
	}
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 1 || rep.Applied != 0 || rep.Unapplied != 1 {
		t.Errorf("audit %+v, %v", rep, err)
	}
}

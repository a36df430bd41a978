package ledger

import (
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
)

// failingBudget is an accountant that fails on every question.
type failingBudget struct{}

var errAccountant = errors.New("accountant failed")

func (failingBudget) check(accounting.Event, float64) (func() (bool, error), error) {
	return nil, errAccountant
}
func (failingBudget) add(accounting.Event) error { return errAccountant }
func (failingBudget) clone() budget              { return failingBudget{} }
func (failingBudget) epsilon() (float64, error)  { return 0, errAccountant }

// TestAccountantFailureIsNeverZero: an accountant that fails is an error
// or +Inf in every report, never "nothing spent". Before, Spent returned
// 0 when the accountant failed or returned +Inf.
//
//   - A live ledger whose accountant starts failing refuses the charge
//     (nothing recorded) and Spent still reports what was charged.
//   - A ledger file holding a charge its run's accountant cannot compose
//     (a discrete Gaussian without its lattice in a PLD run, written
//     around Charge) does not open, and its audit fails with the
//     recomputed ε +Inf (null in JSON), not 0.
func TestAccountantFailureIsNeverZero(t *testing.T) {
	l, path := newPLDLedger(t, 10)
	e := accounting.SubsampledGaussian(testQ, testSigma)
	for i := range 3 {
		if _, err := l.Charge(int64(i+1), e, at(1, uint64(i+1)), false); err != nil {
			t.Fatal(err)
		}
	}
	spent := l.Spent()
	if !(spent > 0) {
		t.Fatalf("Spent %v after 3 charges", spent)
	}
	l.budget = failingBudget{}
	if _, err := l.Charge(4, e, at(1, 4), false); !errors.Is(err, errAccountant) {
		t.Errorf("Charge with a failing accountant: %v, want its error", err)
	}
	if got := l.Spent(); got != spent || l.Charges() != 3 {
		t.Errorf("after the failed charge: Spent %v (want %v), %d charges", got, spent, l.Charges())
	}

	// A record the accountant cannot compose, appended around Charge.
	if _, err := l.file.Append(Record{Kind: RecordCharge, Step: 4, Event: ptr(accounting.SubsampledDiscreteGaussian(testQ, testSigma)),
		History: testHistory, Term: 1, Index: 4, Epsilon: spent}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if l2, err := Open(path); err == nil {
		l2.Close()
		t.Error("a ledger whose charge the accountant cannot compose opened")
	} else if !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open: %v, want ErrCorrupt", err)
	}
	rep, err := Audit(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !math.IsInf(rep.RecomputedEpsilon, 1) || rep.RecordedEpsilon != spent {
		t.Errorf("audit: OK %v, recorded %v (want %v), recomputed %v (want +Inf)", rep.OK, rep.RecordedEpsilon, spent, rep.RecomputedEpsilon)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatalf("the audit report with +Inf does not encode: %v", err)
	}
	if !strings.Contains(string(b), `"recomputed_epsilon":null`) {
		t.Errorf("JSON %s: want recomputed_epsilon null", b)
	}
	var back AuditReport
	if err := json.Unmarshal(b, &back); err != nil || !math.IsInf(back.RecomputedEpsilon, 1) || back.RecordedEpsilon != spent {
		t.Errorf("decoded: recomputed %v, recorded %v (%v)", back.RecomputedEpsilon, back.RecordedEpsilon, err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestAuditFailsOnEditedEpsilon: a ledger with one record's ε edited (and
// its hash chain recomputed, as a forger would) fails the audit, on a
// PLD ledger whose ε follows the count grid.
func TestAuditFailsOnEditedEpsilon(t *testing.T) {
	for _, factor := range []float64{0.999, 1.001} {
		l, path := newPLDLedger(t, 10)
		e := accounting.SubsampledGaussian(testQ, testSigma)
		var recs []Record
		for i := range 6 {
			r, err := l.Charge(int64(i+1), e, at(1, uint64(i+1)), false)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		l.Close()
		// Rewrite the file with record 4's ε scaled and every hash redone.
		all, _, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		forged := filepath.Join(t.TempDir(), "ledger.log")
		f, _, err := OpenFile(forged)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range all {
			if r.Kind == RecordCharge && r.Step == 4 {
				r.Epsilon *= factor
			}
			r.Seq, r.Hash, r.PrevHash = 0, "", ""
			if _, err := f.Append(r); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		rep, err := Audit(forged)
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK || len(rep.Problems) == 0 || !strings.Contains(strings.Join(rep.Problems, "\n"), "step 4") {
			t.Errorf("ε × %v: audit %+v, want a problem naming step 4", factor, rep)
		}
		if good, err := Audit(path); err != nil || !good.OK {
			t.Errorf("the original: %+v, %v", good, err)
		}
	}
}

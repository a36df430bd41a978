package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
)

// TestAuditEndRecord: step 3 charged ahead of its g̃ (term 1), its leader
// lost, the budget ending the run at step 2 in term 2. The end record
// makes the audit count 2 applied steps and 1 charged and never applied,
// with every charge's ε.
func TestAuditEndRecord(t *testing.T) {
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 3) // indexes 11, 12, 13
	spent := l.Spent()
	if _, err := l.End(2, "privacy budget exhausted", at(2, 15)); err != nil {
		t.Fatal(err)
	}
	if got := l.Spent(); got != spent {
		t.Errorf("Spent after End = %v, want %v", got, spent)
	}
	rep, err := Audit(path)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Applied != 2 || rep.Unapplied != 1 || rep.Charges != 3 || rep.LastStep != 3 ||
		!rep.Ended || rep.EndStep != 2 || rep.EndReason != "privacy budget exhausted" || rep.RecordedEpsilon != spent {
		t.Errorf("audit: %+v", rep)
	}

	// Without the end record, the same charges read as 2 applied steps
	// and step 3 unconfirmed: it may have been charged ahead of its g̃.
	without := filepath.Join(t.TempDir(), "ledger.log")
	recs, _, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(without, full[:frameLen(t, full, len(recs)-1)], 0o644); err != nil {
		t.Fatal(err)
	}
	if rep, _ := Audit(without); !rep.OK || rep.Applied != 2 || rep.Unconfirmed != 1 || rep.Unapplied != 0 || rep.Ended {
		t.Errorf("audit without the end record: %+v", rep)
	}
}

// TestEndedRunTakesNoAppliedCharges: after the end record the ledger
// refuses a charge of an applied step, also after reopening, takes replay
// charges (a release committed after the end is still charged), records
// the same end again as nothing (Raft replaying the entry that ended the
// run) and refuses another end.
func TestEndedRunTakesNoAppliedCharges(t *testing.T) {
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 2)
	end, err := l.End(2, "max steps reached", at(1, 12))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got, ok := l.Ended(); !ok || got != end {
		t.Fatalf("Ended after reopen = %+v, %v; want %+v", got, ok, end)
	}
	e := accounting.SubsampledGaussian(testQ, testSigma)
	if _, err := l.Charge(3, e, at(1, 13), false); !errors.Is(err, ErrRunEnded) {
		t.Errorf("applied charge after the end: %v, want ErrRunEnded", err)
	}
	if _, err := l.Charge(3, e, at(1, 14), true); err != nil {
		t.Errorf("replay charge after the end: %v", err)
	}
	_, n := l.Head()
	if got, err := l.End(2, "max steps reached", at(1, 12)); err != nil || got != end {
		t.Errorf("the same end again = %+v, %v", got, err)
	}
	if _, m := l.Head(); m != n {
		t.Errorf("the same end again wrote a record: %d records, want %d", m, n)
	}
	for _, tc := range []struct {
		step   int64
		reason string
		pos    Position
	}{{1, "max steps reached", at(1, 12)}, {2, "privacy budget exhausted", at(1, 12)}, {2, "max steps reached", at(1, 16)}} {
		if _, err := l.End(tc.step, tc.reason, tc.pos); !errors.Is(err, ErrRunEnded) {
			t.Errorf("End(%d, %q, %+v) = %v, want ErrRunEnded", tc.step, tc.reason, tc.pos, err)
		}
	}
	rep, _ := Audit(path)
	if !rep.OK || rep.Applied != 2 || rep.Replays != 1 || rep.Charges != 3 || rep.EndStep != 2 {
		t.Errorf("audit: %+v", rep)
	}
}

// TestEndRefusals: End before the last charge, of another history, or
// malformed is refused and records nothing.
func TestEndRefusals(t *testing.T) {
	l, _ := newLedger(t, 10)
	chargeSteps(t, l, 1, 2) // last index 12
	_, n := l.Head()
	for _, tc := range []struct {
		name   string
		reason string
		step   int64
		pos    Position
		want   error
	}{
		{"before the last charge", "x", 2, at(1, 11), ErrOutOfOrder},
		{"another history", "x", 2, Position{History: "other", Term: 1, Index: 13}, ErrHistoryMismatch},
		{"no reason", "", 2, at(1, 13), ErrInvalidParameter},
		{"negative step", "x", -1, at(1, 13), ErrInvalidParameter},
	} {
		if _, err := l.End(tc.step, tc.reason, tc.pos); !errors.Is(err, tc.want) {
			t.Errorf("%s: End = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, m := l.Head(); m != n {
		t.Errorf("refused ends wrote %d records", m-n)
	}
	if _, ok := l.Ended(); ok {
		t.Error("Ended after refused ends")
	}
}

// TestReadRefusesMalformedEnd: an end record without a reason, with a
// negative step, without a Raft index or with a charge's event is
// ErrCorrupt, however well it is framed and hashed; so are a second end
// record, and a charge of an applied step after the end (on Open).
func TestReadRefusesMalformedEnd(t *testing.T) {
	e := accounting.SubsampledGaussian(testQ, testSigma)
	run := Record{Kind: RecordRun, Run: "r", TargetEpsilon: 10, Delta: 1e-5, History: testHistory}
	charge := Record{Kind: RecordCharge, Step: 1, Event: &e, History: testHistory, Term: 1, Index: 2, Epsilon: 0.5}
	end := Record{Kind: RecordEnd, Step: 1, Reason: "max steps reached", History: testHistory, Term: 1, Index: 3}
	bad := func(mod func(*Record)) Record { r := end; mod(&r); return r }
	for _, tc := range []struct {
		name string
		recs []Record
	}{
		{"no reason", []Record{run, bad(func(r *Record) { r.Reason = "" })}},
		{"negative step", []Record{run, bad(func(r *Record) { r.Step = -1 })}},
		{"no index", []Record{run, bad(func(r *Record) { r.Index = 0 })}},
		{"an event", []Record{run, bad(func(r *Record) { r.Event = &e })}},
		{"replay mark", []Record{run, bad(func(r *Record) { r.Replay = true })}},
	} {
		if _, _, err := scan(bytes.NewReader(chain(t, tc.recs))); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: scan = %v, want ErrCorrupt", tc.name, err)
		}
	}
	for _, tc := range []struct {
		name string
		recs []Record
	}{
		{"second end", []Record{run, end, bad(func(r *Record) { r.Index = 4 })}},
		{"applied charge after the end", []Record{run, end, bad(func(r *Record) { *r = charge; r.Step, r.Index = 2, 4 })}},
		{"end before the run record", []Record{end}},
	} {
		path := filepath.Join(t.TempDir(), "ledger.log")
		if err := os.WriteFile(path, chain(t, tc.recs), 0o644); err != nil {
			t.Fatal(err)
		}
		if l, err := Open(path); !errors.Is(err, ErrCorrupt) {
			if err == nil {
				l.Close()
			}
			t.Errorf("%s: Open = %v, want ErrCorrupt", tc.name, err)
		}
	}
}

// chain frames recs as a valid ledger file: sequence numbers, hash chain
// and CRCs filled in, nothing else checked.
func chain(t *testing.T, recs []Record) []byte {
	t.Helper()
	var buf bytes.Buffer
	prev := genesisHash
	for i, r := range recs {
		r.Format, r.Seq, r.PrevHash = FileFormat, uint64(i+1), prev
		h, _, err := computeHash(r)
		if err != nil {
			t.Fatal(err)
		}
		r.Hash = h
		writeFrame(t, &buf, r)
		prev = h
	}
	return buf.Bytes()
}

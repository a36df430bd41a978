package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

const otherHistory = "fedcba9876543210fedcba9876543210"

// TestLedgerBoundToHistory: once started, a ledger accounts only for its
// Raft history. Another history's Start, Charged and Charge are refused
// with ErrHistoryMismatch and record nothing; within the history, an index
// at or below LastIndex is a replay (Charged) and charging it again is
// refused (ErrOutOfOrder), never silently skipped.
func TestLedgerBoundToHistory(t *testing.T) {
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 5) // indexes 11..15
	before, _ := os.ReadFile(path)
	e := accounting.SubsampledGaussian(testQ, testSigma)

	if err := l.Start("test-run", 10, 1e-5, seed.Crypto, MechanismFloat, "", otherHistory); !errors.Is(err, ErrHistoryMismatch) {
		t.Errorf("Start from another history: %v, want ErrHistoryMismatch", err)
	}
	for _, idx := range []uint64{3, 15, 16, 1000} {
		if done, err := l.Charged(Position{History: otherHistory, Term: 1, Index: idx}); done || !errors.Is(err, ErrHistoryMismatch) {
			t.Errorf("Charged(other history, index %d) = %v, %v; want false, ErrHistoryMismatch", idx, done, err)
		}
		if _, err := l.Charge(6, e, Position{History: otherHistory, Term: 1, Index: idx}, false); !errors.Is(err, ErrHistoryMismatch) {
			t.Errorf("Charge(other history, index %d) = %v, want ErrHistoryMismatch", idx, err)
		}
	}
	if _, err := l.Charge(6, e, at(1, 15), false); !errors.Is(err, ErrOutOfOrder) {
		t.Errorf("Charge at the last charged index: %v, want ErrOutOfOrder", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) || l.Charges() != 5 {
		t.Fatalf("refused calls changed the ledger (%d charges)", l.Charges())
	}
	for _, tc := range []struct {
		index uint64
		want  bool
	}{{11, true}, {15, true}, {16, false}} {
		if got, err := l.Charged(at(1, tc.index)); got != tc.want || err != nil {
			t.Errorf("Charged(index %d) = %v, %v; want %v", tc.index, got, err, tc.want)
		}
	}
	if _, err := l.Charge(6, e, at(1, 16), false); err != nil {
		t.Fatal(err)
	}
	rep, err := Audit(path)
	if err != nil || !rep.OK || rep.History != testHistory || rep.Charges != 6 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

// TestCheckRaftState: a ledger with a run record resumes only on a Raft
// state of its history that still holds every charged entry.
func TestCheckRaftState(t *testing.T) {
	l, _ := newLedger(t, 10)
	chargeSteps(t, l, 1, 5) // last index 15
	empty, err := Open(filepath.Join(t.TempDir(), "ledger.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	for _, tc := range []struct {
		name   string
		l      *Ledger
		s      RaftState
		ok     bool
		detail string
	}{
		{"empty ledger, no Raft state", empty, RaftState{}, true, ""},
		{"empty ledger, any Raft state", empty, RaftState{Configured: true, History: otherHistory, LastIndex: 3}, true, ""},
		{"no Raft state", l, RaftState{}, false, "Raft state is empty"},
		{"Raft state without configuration", l, RaftState{LastIndex: 40}, false, "no run configuration"},
		{"another history", l, RaftState{Configured: true, History: otherHistory, LastIndex: 40}, false, otherHistory},
		{"another history, shorter", l, RaftState{Configured: true, History: otherHistory, LastIndex: 7}, false, otherHistory},
		{"configuration without history", l, RaftState{Configured: true, LastIndex: 40}, false, "(none recorded)"},
		{"log lost its tail", l, RaftState{Configured: true, History: testHistory, LastIndex: 14}, false, "ends at index 14"},
		{"log reaches the last charge", l, RaftState{Configured: true, History: testHistory, LastIndex: 15}, true, ""},
		{"log ahead", l, RaftState{Configured: true, History: testHistory, LastIndex: 90}, true, ""},
	} {
		err := tc.l.CheckRaftState(tc.s)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && !errors.Is(err, ErrHistoryMismatch):
			t.Errorf("%s: %v, want ErrHistoryMismatch", tc.name, err)
		case !tc.ok && !strings.Contains(err.Error(), tc.detail):
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.detail)
		}
	}
}

// TestLedgerBeforeHistory: testdata/ledger-before-history.log was written
// by the ledger before history IDs existed (a run record and 5 charges,
// indexes 3-7, none with a history). It opens and audits clean with no
// history; it is bound to configuration entries without a history ID, so
// it resumes on such a Raft state and refuses any history that has one.
func TestLedgerBeforeHistory(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "ledger-before-history.log"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ledger.log")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Audit(path)
	if err != nil || !rep.OK || rep.History != "" || rep.Charges != 5 {
		t.Fatalf("audit of a ledger from before history IDs: %+v, %v", rep, err)
	}
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.CheckRaftState(RaftState{Configured: true, LastIndex: 7}); err != nil {
		t.Errorf("its own (ID-less) Raft state: %v", err)
	}
	if err := l.CheckRaftState(RaftState{Configured: true, History: testHistory, LastIndex: 70}); !errors.Is(err, ErrHistoryMismatch) {
		t.Errorf("a Raft state with a history ID: %v", err)
	}
	if err := l.CheckRaftState(RaftState{}); !errors.Is(err, ErrHistoryMismatch) {
		t.Errorf("no Raft state: %v", err)
	}
	if err := l.Start("legacy-run", 3, 1e-5, seed.Crypto, "", "", testHistory); !errors.Is(err, ErrHistoryMismatch) {
		t.Errorf("Start with a history ID: %v", err)
	}
	if err := l.Start("legacy-run", 3, 1e-5, seed.Crypto, "", "", ""); err != nil {
		t.Fatalf("Start as before: %v", err)
	}
	if _, err := l.Charge(6, accounting.SubsampledGaussian(0.01, 1.1), Position{Term: 2, Index: 8}, false); err != nil {
		t.Fatal(err)
	}
	if rep, err := Audit(path); err != nil || !rep.OK || rep.Charges != 6 {
		t.Errorf("audit after a charge: %+v, %v", rep, err)
	}
}

// TestAuditDetectsHistoryReuse: a ledger whose charges come from two Raft
// histories fails the audit: by the charges' history IDs, and, for records
// without IDs (ledgers from before them), by a Raft term going back.
func TestAuditDetectsHistoryReuse(t *testing.T) {
	e := accounting.SubsampledGaussian(testQ, testSigma)
	write := func(t *testing.T, recs ...Record) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "ledger.log")
		f, _, err := OpenFile(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		acc := accounting.RDP{}.NewComposition()
		for _, r := range recs {
			if r.Kind == RecordCharge {
				r.Event = &e
				acc.Compose(e, 1)
				r.Epsilon, _, _ = acc.Epsilon(1e-5)
			}
			if _, err := f.Append(r); err != nil {
				t.Fatal(err)
			}
		}
		return path
	}
	run := func(h string) Record {
		return Record{Kind: RecordRun, Run: "r", TargetEpsilon: 10, Delta: 1e-5, Noise: seed.Crypto, History: h}
	}
	charge := func(h string, step int64, term, index uint64) Record {
		return Record{Kind: RecordCharge, Step: step, History: h, Term: term, Index: index}
	}
	for _, tc := range []struct {
		name string
		recs []Record
		want string // a problem containing this; "" for a clean audit
	}{
		{"one history", []Record{run(testHistory), charge(testHistory, 1, 2, 3), charge(testHistory, 2, 2, 4), charge(testHistory, 3, 5, 9)}, ""},
		{"second history's charges", []Record{run(testHistory), charge(testHistory, 1, 2, 3), charge(testHistory, 2, 2, 4), charge(otherHistory, 3, 2, 5)}, "reused across Raft histories"},
		{"IDs from before history IDs", []Record{run(""), charge("", 1, 2, 3), charge("", 2, 3, 4), charge("", 3, 3, 5)}, ""},
		{"term goes back", []Record{run(""), charge("", 1, 4, 3), charge("", 2, 4, 4), charge("", 3, 2, 5)}, "term 2 after term 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Audit(write(t, tc.recs...))
			if err != nil {
				t.Fatal(err)
			}
			problems := strings.Join(rep.Problems, "; ")
			if tc.want == "" && !rep.OK || tc.want != "" && (rep.OK || !strings.Contains(problems, tc.want)) {
				t.Errorf("audit OK=%v, problems %q; want %q", rep.OK, problems, tc.want)
			}
			// A ledger the audit rejects for mixed history IDs does not
			// open either: no replica resumes it.
			if strings.Contains(problems, "reused across Raft histories") && tc.name == "second history's charges" {
				if _, err := Open(filepath.Join(filepath.Dir(rep.Path), "ledger.log")); !errors.Is(err, ErrCorrupt) {
					t.Errorf("Open of a ledger with another history's charge: %v, want ErrCorrupt", err)
				}
			}
		})
	}
}

package ledger

import (
	"fmt"
	"strings"
	"testing"
)

// raftLedger is a finished run's ledger: 6 steps charged, the sixth ahead
// of a g̃ that never came, and the end after step 5. It returns the
// records, as the replay of the Raft state writes them too.
func raftLedger(t *testing.T) []Record {
	t.Helper()
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 6)
	if _, err := l.End(5, "stopped by the operator", at(1, 20)); err != nil {
		t.Fatal(err)
	}
	recs, _, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// TestAuditAgainstRaft: a ledger is audited against the records a replay
// of its Raft state wrote. It must hold all of them: one cut at a record
// boundary (every prefix of a ledger verifies) fails, naming what it lacks
// and the ε it would state, unless its replica is live (then the lacking
// records are entries not applied yet). One that holds more, or other
// records, fails too. A replay that agrees settles the applied steps of a
// run without an end record.
func TestAuditAgainstRaft(t *testing.T) {
	full := raftLedger(t)
	replay := func(recs []Record, applied int64) *RaftReplay {
		return &RaftReplay{SnapshotIndex: 12, LastIndex: 20, Records: recs, Applied: applied}
	}
	other := append([]Record(nil), full...)
	other[3].Hash = strings.Repeat("f", 64)
	for _, tc := range []struct {
		name   string
		ledger []Record
		opts   AuditOptions
		ok     bool
		want   string // in the first problem
		check  func(AuditReport) bool
	}{
		{name: "whole", ledger: full, opts: AuditOptions{Raft: replay(full, 5)}, ok: true,
			check: func(r AuditReport) bool {
				return r.Applied == 5 && r.Unapplied == 1 && r.Lacking == nil && r.Raft.Count == 8
			}},
		{name: "end record cut", ledger: full[:7], opts: AuditOptions{Raft: replay(full, 5)},
			want: "the ledger lacks 1 record(s) that the data dir's Raft state (its snapshot at index 12 and log to index 20, replayed) holds: the end record (stopped by the operator). The ledger under-states",
			check: func(r AuditReport) bool {
				return r.Lacking != nil && r.Lacking.End && r.Lacking.Charges == 0 && r.Applied == 5 && r.Unconfirmed == 1
			}},
		{name: "charges cut", ledger: full[:4], opts: AuditOptions{Raft: replay(full, 5)},
			want: "holds: 3 charge(s), for steps 4–6, after which ε spent is " + trimEps(full[6].Epsilon) + ", not the " + trimEps(full[3].Epsilon) + " the ledger states, and the end record (stopped by the operator). The ledger under-states",
			check: func(r AuditReport) bool {
				return r.Lacking.Records == 4 && r.Lacking.FromStep == 4 && r.Lacking.ToStep == 6 && r.Lacking.Epsilon == full[6].Epsilon && r.Lacking.Stated == full[3].Epsilon
			}},
		{name: "live, behind", ledger: full[:4], opts: AuditOptions{Live: true, Raft: replay(full, 5)}, ok: true,
			check: func(r AuditReport) bool {
				return r.Live && r.Lacking.Records == 4 && r.Applied == 2 && r.Unconfirmed == 1
			}},
		{name: "ahead of the Raft state", ledger: full, opts: AuditOptions{Raft: replay(full[:5], 4)}, ok: true,
			check: func(r AuditReport) bool {
				return len(r.Notes) == 1 && strings.HasPrefix(r.Notes[0], "the ledger holds 3 record(s) after the 5 that the data dir's Raft state") &&
					r.Applied == 5 && r.Unapplied == 1
			}},
		{name: "cut below the snapshot", ledger: full[:3], opts: AuditOptions{Raft: &RaftReplay{SnapshotIndex: 20, LastIndex: 20, SnapshotRecords: 8, Records: full, Applied: 5}},
			want: "The ledger under-states what was spent: the newest snapshot alone holds 8 records of this replica's ledger, which only grows, so the file was cut or replaced by an older copy"},
		{name: "another run", ledger: other, opts: AuditOptions{Raft: replay(full, 5)},
			want: "record 4 (charge of step 3 at Raft index 13) differs from the record the data dir's Raft state writes there"},
		{name: "replay failed", ledger: full, opts: AuditOptions{Raft: &RaftReplay{Failed: "entry 14: bad"}},
			want: "replaying the data dir's Raft state failed: entry 14: bad"},
		{name: "no Raft state", ledger: full[:6], opts: AuditOptions{Raft: &RaftReplay{Unavailable: "no Raft log"}}, ok: true,
			check: func(r AuditReport) bool { return r.Applied == 4 && r.Unconfirmed == 1 && r.Raft.Unavailable != "" }},
		{name: "no end record, settled by the replay", ledger: full[:7], opts: AuditOptions{Raft: replay(full[:7], 5)}, ok: true,
			check: func(r AuditReport) bool { return r.Applied == 5 && r.Unapplied == 1 && r.Unconfirmed == 0 }},
		{name: "replay applied more than the ledger charged", ledger: full[:7], opts: AuditOptions{Raft: replay(full[:7], 7)},
			want: "the Raft state applied steps 1–7, but the ledger charges 6 steps as applied up to step 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Contents{Path: "ledger.log", Records: tc.ledger}.Audit(tc.opts)
			if rep.OK != tc.ok || (!tc.ok && (len(rep.Problems) == 0 || !strings.Contains(rep.Problems[0], tc.want))) {
				t.Fatalf("OK %v, problems %q; want OK %v, first problem with %q", rep.OK, rep.Problems, tc.ok, tc.want)
			}
			if tc.check != nil && !tc.check(rep) {
				t.Errorf("report %+v, lacking %+v", rep, rep.Lacking)
			}
		})
	}
}

// trimEps formats ε as the problems do.
func trimEps(e float64) string { return fmt.Sprintf("%.6g", e) }

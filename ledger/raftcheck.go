package ledger

import (
	"fmt"
	"strings"
)

// Checking a ledger against its Raft state.
//
// The ledger alone cannot show that it lacks records at its end: every
// prefix of a valid ledger is valid, so a file cut at a record boundary
// (or one whose end record was lost) audits clean and states less ε than
// was spent. The replica's Raft state can: the state machine writes each
// record while it applies an entry, deterministically, so replaying the
// data dir's newest snapshot and every log entry after it through a fresh
// state machine writes, record for record, what the ledger must hold
// (coordinator.ReadLedger does that and fills a RaftReplay). The ledger
// must hold every record the replay wrote, with the same hash at the same
// position; a replay that writes more names what the ledger lacks.

// RaftReplay is a replica data dir's Raft state (its newest snapshot that
// decodes, and every log entry after it) applied to a fresh state machine
// whose ledger is a scratch file.
type RaftReplay struct {
	// Unavailable, if not empty, says why the dir has no Raft state to
	// replay (none, or a log of an earlier version that only a replica
	// migrates): the ledger is then audited alone, and the other fields
	// are zero.
	Unavailable string `json:"unavailable,omitempty"`
	// Failed, if not empty, says why the replay stopped part-way (an
	// entry the state machine could not apply): a problem.
	Failed string `json:"failed,omitempty"`
	// SnapshotIndex is the Raft index of the snapshot replayed (0: none);
	// LastIndex the last log entry replayed.
	SnapshotIndex uint64 `json:"snapshot_index"`
	LastIndex     uint64 `json:"last_index"`
	// SnapshotRecords is how many ledger records the snapshot held: the
	// replica's own ledger, as it was when the snapshot was taken (or
	// the leader's, installed).
	SnapshotRecords int `json:"snapshot_records"`
	// Records are the ledger records the replay wrote, Count their number.
	Records []Record `json:"-"`
	Count   int      `json:"records"`
	// Applied is the last step the replay applied; Stopped why its run
	// ended ("" if it had not).
	Applied int64  `json:"applied_step"`
	Stopped string `json:"stopped,omitempty"`
}

// Lacking describes the records a replay of the Raft state wrote after
// the ledger's last one.
type Lacking struct {
	Records int `json:"records"`
	// Charges are the charge records among them, for steps FromStep to
	// ToStep; Epsilon is ε spent after the last of them, what the ledger
	// would state if it held them, and Stated what it states (its last
	// charge's; both 0 with no charges lacking).
	Charges  int     `json:"charges"`
	FromStep int64   `json:"from_step,omitempty"`
	ToStep   int64   `json:"to_step,omitempty"`
	Epsilon  float64 `json:"epsilon,omitempty"`
	Stated   float64 `json:"stated_epsilon,omitempty"`
	// End says the end record is among them, EndReason why the run ended.
	End       bool   `json:"end"`
	EndReason string `json:"end_reason,omitempty"`
}

// String says what is lacking, in words.
func (l Lacking) String() string {
	var parts []string
	if l.Charges > 0 {
		steps := fmt.Sprintf("step %d", l.FromStep)
		if l.ToStep != l.FromStep {
			steps = fmt.Sprintf("steps %d–%d", l.FromStep, l.ToStep)
		}
		parts = append(parts, fmt.Sprintf("%d charge(s), for %s, after which ε spent is %.6g, not the %.6g the ledger states", l.Charges, steps, l.Epsilon, l.Stated))
	}
	if l.End {
		parts = append(parts, fmt.Sprintf("the end record (%s)", l.EndReason))
	}
	if other := l.Records - l.Charges - btoi(l.End); other > 0 {
		parts = append(parts, fmt.Sprintf("%d other record(s)", other))
	}
	if len(parts) > 1 {
		return strings.Join(parts[:len(parts)-1], ", ") + ", and " + parts[len(parts)-1]
	}
	return strings.Join(parts, "")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// raftComparison is a ledger's records compared with a RaftReplay.
type raftComparison struct {
	replay *RaftReplay // a copy of AuditOptions.Raft, Count filled; nil without one
	// problems are the disagreements, in words; notes what the audit
	// says without failing; lacking the records the replay wrote after
	// the ledger's last (nil if none).
	problems []string
	notes    []string
	lacking  *Lacking
	// agrees says the ledger holds exactly the records the replay wrote:
	// the replay's applied step is then the run's.
	agrees bool
}

// compareRaft compares recs, a ledger's records, with opts.Raft's.
func compareRaft(recs []Record, opts AuditOptions) raftComparison {
	if opts.Raft == nil {
		return raftComparison{}
	}
	replay := *opts.Raft
	replay.Count = len(replay.Records)
	c := raftComparison{replay: &replay}
	if replay.Unavailable != "" {
		return c
	}
	if replay.Failed != "" {
		c.problems = append(c.problems, fmt.Sprintf("replaying the data dir's Raft state failed: %s", replay.Failed))
		return c
	}
	theirs := replay.Records
	n := min(len(recs), len(theirs))
	for i := range n {
		if recs[i].Hash != theirs[i].Hash {
			c.problems = append(c.problems, fmt.Sprintf(
				"record %d (%s) differs from the record the data dir's Raft state writes there (%s): the ledger and the Raft state are not of one run",
				recs[i].Seq, describe(recs[i]), describe(theirs[i])))
			return c
		}
	}
	state := fmt.Sprintf("the data dir's Raft state (%s, replayed)", replay.Span())
	switch {
	case len(recs) > len(theirs):
		// More than the Raft state holds is never less than was spent:
		// the Raft state lost what the ledger charged, and the ledger
		// stands.
		c.notes = append(c.notes, fmt.Sprintf(
			"the ledger holds %d record(s) after the %d that %s reproduces, from record %d (%s): entries it charged are gone from the Raft log and snapshots (deleted, or restored from an older backup), so a replica will not start on this dir; the ledger states more than that Raft state, never less",
			len(recs)-len(theirs), len(theirs), state, recs[n].Seq, describe(recs[n])))
	case len(theirs) > len(recs):
		c.lacking = lacking(recs, theirs[n:])
		if opts.Live {
			break
		}
		why := "either the file was cut or replaced by an older copy (restore it from a backup or from another replica of the run), " +
			"or the replica stopped before applying entries it had logged (start it again, let it apply them, and audit again), " +
			"or the log ends in entries a deposed leader logged and never committed (the next leader replaces them)"
		if len(recs) < replay.SnapshotRecords {
			why = fmt.Sprintf("the newest snapshot alone holds %d records of this replica's ledger, which only grows, so the file was cut or replaced by an older copy "+
				"(restore it from a backup or from another replica of the run)", replay.SnapshotRecords)
		}
		c.problems = append(c.problems, fmt.Sprintf("the ledger lacks %d record(s) that %s holds: %s. The ledger under-states what was spent: %s",
			len(theirs)-len(recs), state, c.lacking, why))
	default:
		c.agrees = true
	}
	return c
}

// Span names the Raft state the replay read.
func (r RaftReplay) Span() string {
	switch {
	case r.SnapshotIndex == 0:
		return fmt.Sprintf("its log to index %d, no snapshot", r.LastIndex)
	case r.LastIndex <= r.SnapshotIndex:
		return fmt.Sprintf("its snapshot at index %d, no log entry after it", r.SnapshotIndex)
	}
	return fmt.Sprintf("its snapshot at index %d and log to index %d", r.SnapshotIndex, r.LastIndex)
}

// lacking summarizes missing, the records a ledger of records recs lacks.
func lacking(recs, missing []Record) *Lacking {
	l := &Lacking{Records: len(missing)}
	for _, r := range recs {
		if r.Kind == RecordCharge {
			l.Stated = r.Epsilon
		}
	}
	for _, r := range missing {
		switch r.Kind {
		case RecordCharge:
			if l.Charges == 0 || r.Step < l.FromStep {
				l.FromStep = r.Step
			}
			l.Charges++
			l.ToStep = max(l.ToStep, r.Step)
			l.Epsilon = r.Epsilon
		case RecordEnd:
			l.End, l.EndReason = true, r.Reason
		}
	}
	return l
}

// describe names a record in a problem.
func describe(r Record) string {
	switch r.Kind {
	case RecordCharge:
		return fmt.Sprintf("charge of step %d at Raft index %d", r.Step, r.Index)
	case RecordEnd:
		return fmt.Sprintf("end after step %d: %s", r.Step, r.Reason)
	}
	return fmt.Sprintf("%s record", r.Kind)
}

// Damage returns, in words, what is wrong with the file c beyond its
// records' own checks: corruption, a torn tail (unless opts.Live: an
// append in progress), and what opts.Raft's replay disagrees on or holds
// that the ledger lacks. `ledger show` states it before the records; an
// audit states it first among its problems.
func (c Contents) Damage(opts AuditOptions) []string {
	return c.damage(opts, compareRaft(c.Records, opts))
}

func (c Contents) damage(opts AuditOptions, cmp raftComparison) []string {
	var out []string
	if c.Err != nil {
		out = append(out, c.Err.Error())
	}
	if c.TornBytes > 0 && !opts.Live {
		out = append(out, fmt.Sprintf(
			"torn tail: %d byte(s) after record %d, the last complete one, are not a whole record: the file was cut, or a crash interrupted an append and no replica has reopened the ledger since (starting the replica repairs it, and Raft charges the entry again)",
			c.TornBytes, len(c.Records)))
	}
	return append(out, cmp.problems...)
}

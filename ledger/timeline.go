package ledger

import "fmt"

// Timeline is a ledger's ε over its charges, with the points where the
// ledger shows something other than the next step charged under the same
// leader: replays and new Raft terms. Audit reports draw it
// (coordinator ledger audit --report).
type Timeline struct {
	Run           string  `json:"run"`
	TargetEpsilon float64 `json:"target_epsilon"`
	Delta         float64 `json:"delta"`
	// Points holds one point per charge record, in file order.
	Points []TimelinePoint `json:"points"`
	// Marks lists the replays and term changes, in file order.
	Marks []Mark `json:"marks"`
}

// TimelinePoint is one charge: the step it released and ε spent after it.
type TimelinePoint struct {
	Seq     uint64  `json:"seq"`
	Step    int64   `json:"step"`
	Epsilon float64 `json:"epsilon"`
	Term    uint64  `json:"term"`
	Index   uint64  `json:"index"`
	Replay  bool    `json:"replay,omitempty"`
}

// MarkKind names what a Mark shows.
type MarkKind string

const (
	// MarkReplay: a release of a step that had already been applied (a
	// charge record with Replay set). It was committed, so it is charged,
	// once; the update was not applied again.
	MarkReplay MarkKind = "replay"
	// MarkNewTerm: the first charge of a higher Raft term than the
	// previous charge's. A new leader was elected between the two
	// releases, after a leader change (failover, transfer) or after the
	// cluster restarted and resumed the run: the ledger records the term
	// but not which replica led, so it cannot tell the two apart. With a
	// single replica every new term is a restart.
	MarkNewTerm MarkKind = "new_term"
)

// Mark is a point on the timeline worth showing: the charge record (Seq,
// Step, Point: its index in Points) and, for MarkNewTerm, the term before.
type Mark struct {
	Kind     MarkKind `json:"kind"`
	Seq      uint64   `json:"seq"`
	Step     int64    `json:"step"`
	Point    int      `json:"point"`
	Term     uint64   `json:"term"`
	PrevTerm uint64   `json:"prev_term,omitempty"`
}

// NewTimeline builds the timeline of verified records (ReadFile's): the
// first must be the run record, and every other a charge or the end
// record (which it skips: it charges nothing), else it returns
// an error wrapping ErrCorrupt. It checks nothing else: Audit does. A
// replay that opens a new term gets both marks, the term's first.
func NewTimeline(recs []Record) (Timeline, error) {
	if len(recs) == 0 || recs[0].Kind != RecordRun {
		return Timeline{}, fmt.Errorf("%w: the ledger does not open with a run record", ErrCorrupt)
	}
	run := recs[0]
	tl := Timeline{Run: run.Run, TargetEpsilon: run.TargetEpsilon, Delta: run.Delta, Points: []TimelinePoint{}, Marks: []Mark{}}
	var lastTerm uint64
	for _, r := range recs[1:] {
		if r.Kind == RecordEnd {
			continue // it charges nothing
		}
		if r.Kind != RecordCharge {
			return Timeline{}, fmt.Errorf("%w: record %d is a %q record, want a charge", ErrCorrupt, r.Seq, r.Kind)
		}
		i := len(tl.Points)
		tl.Points = append(tl.Points, TimelinePoint{Seq: r.Seq, Step: r.Step, Epsilon: r.Epsilon, Term: r.Term, Index: r.Index, Replay: r.Replay})
		if i > 0 && r.Term > lastTerm {
			tl.Marks = append(tl.Marks, Mark{Kind: MarkNewTerm, Seq: r.Seq, Step: r.Step, Point: i, Term: r.Term, PrevTerm: lastTerm})
		}
		if r.Replay {
			tl.Marks = append(tl.Marks, Mark{Kind: MarkReplay, Seq: r.Seq, Step: r.Step, Point: i, Term: r.Term})
		}
		lastTerm = max(lastTerm, r.Term)
	}
	return tl, nil
}

// Count returns the number of marks of kind k.
func (tl Timeline) Count(k MarkKind) int {
	n := 0
	for _, m := range tl.Marks {
		if m.Kind == k {
			n++
		}
	}
	return n
}

package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// auditTolerance is the relative difference allowed between a recorded ε
// and the auditor's recomputation. The state machine and the auditor run
// the same accountant over the same events in the same order, so they agree
// exactly; the slack only absorbs a different float formatting round trip.
const auditTolerance = 1e-9

// AuditReport is the result of auditing a ledger file.
type AuditReport struct {
	Path string `json:"path"`
	OK   bool   `json:"ok"`
	// Problems lists every failed check; empty when OK.
	Problems []string `json:"problems"`
	// Notes says, in words, what the audit found that is not a failure
	// (a Raft state that lost entries the ledger charged).
	Notes []string `json:"notes,omitempty"`

	Records int `json:"records"`
	Charges int `json:"charges"`
	Replays int `json:"replays"`
	// Recharges counts charges for a step already charged as applied: the
	// leader that charged it first died (or was deposed) after the charge
	// was committed and before its g̃ was, and the next leader released
	// the step again with fresh noise. Both releases are charged.
	Recharges int `json:"recharges"`
	// Applied counts the distinct steps charged as applied: with an end
	// record, those up to its step (the last step the run applied); else,
	// with the data dir's Raft state replayed (AuditOptions.Raft) and in
	// agreement with the ledger, those up to the last step the replay
	// applied; else all of them but the last (Unconfirmed).
	Applied int `json:"applied_steps"`
	// Unapplied counts the steps charged as applied after the last step
	// applied (the end record's, or the Raft replay's): charged ahead of
	// their g̃ (the leader charges step t+1 as soon as it releases θ_t),
	// and never applied: the leader was lost, or the run ended or was
	// interrupted, before that g̃ was committed. Their ε counts like every
	// charge's: a lost leader may have released their θ.
	Unapplied int `json:"unapplied_steps"`
	// Unconfirmed is 1 when neither an end record nor a Raft state that
	// agrees with the ledger says which step was applied last (a ledger
	// read alone, a live run's, or one that lacks records):
	// the last step charged as applied may have been charged ahead of its
	// g̃ and never applied, which the ledger cannot tell, so it is counted
	// here and not in Applied. Its ε counts in every case.
	Unconfirmed int `json:"unconfirmed_steps"`
	// LastStep is the highest step charged, applied or not.
	LastStep int64 `json:"last_step"`
	// Ended says the ledger holds an end record; EndStep is the last step
	// the run applied and EndReason why it ended, as that record states.
	Ended     bool   `json:"ended"`
	EndStep   int64  `json:"end_step"`
	EndReason string `json:"end_reason,omitempty"`
	// TornBytes is the size of a torn tail: bytes after the last complete
	// record that are not a whole record. Left by a crash inside an append
	// (OpenFile repairs it when the replica restarts, and Raft charges the
	// entry again), or by a file cut short. It fails the audit unless the
	// run is live (an append in progress).
	TornBytes int64 `json:"torn_bytes"`
	// Live says a replica was running on the ledger's data dir during the
	// audit: the ledger is audited up to its last complete record.
	Live bool `json:"live"`
	// Raft is the data dir's Raft state replayed (AuditOptions.Raft), nil
	// for a ledger audited alone; Lacking, the records that replay wrote
	// and the ledger lacks (nil when it lacks none).
	Raft    *RaftReplay `json:"raft,omitempty"`
	Lacking *Lacking    `json:"lacking,omitempty"`

	Run string `json:"run"`
	// History is the Raft history ID the run record binds the ledger to
	// ("" for a ledger written before history IDs).
	History string `json:"history"`
	// Admission is the dataset budget admission the run record states
	// (Record.DatasetAdmission); nil for a run admitted to none.
	Admission *Admission `json:"admission,omitempty"`
	// Noise is the run record's noise source, and Private is false when
	// it is seed.Seeded: such a run is reproducible and NOT differentially
	// private, whatever ε the ledger records.
	Noise   seed.Policy `json:"noise"`
	Private bool        `json:"private"`
	// Mechanism is the run record's noise mechanism (MechanismDiscrete,
	// MechanismFloat, or "" for a run recorded before the field existed,
	// which used the floating-point sampler).
	Mechanism string `json:"mechanism"`
	// Accountant is the accountant the run enforced its budget with, as
	// the run record names it (AccountantRDP for a record from before the
	// field). RecordedEpsilon and RecomputedEpsilon are that accountant's.
	Accountant    string  `json:"accountant"`
	TargetEpsilon float64 `json:"target_epsilon"`
	Delta         float64 `json:"delta"`
	// RecordedEpsilon is ε spent: what the last charge record holds (0
	// with no charges), the number every report of the run shows.
	// RecomputedEpsilon is the audit's recomputation of it from the
	// records alone (a mismatch is a problem).
	RecordedEpsilon   float64 `json:"recorded_epsilon"`
	RecomputedEpsilon float64 `json:"recomputed_epsilon"`
	// RDPEpsilon and PLDEpsilon are the ε of all the charges, composed
	// afresh by each accountant (RDP over the default orders; PLD by
	// accounting.PLD.EpsilonSteps, for exactly the charges recorded, where
	// a PLD ledger records ε at its count grid: between it and
	// PLDGridRatio times it, which the audit checks). PLDEpsilon is nil when the PLD
	// accountant cannot charge the events (the discrete Gaussian without
	// its lattice) or there are none; PLDNote then says why. Either is
	// +Inf if its accountant fails on the events.
	RDPEpsilon float64  `json:"rdp_epsilon"`
	PLDEpsilon *float64 `json:"pld_epsilon"`
	PLDNote    string   `json:"pld_note,omitempty"`
	HeadHash   string   `json:"head_hash"`
}

// Audit reads the ledger file at path without modifying it and checks, in
// order: every frame's CRC, the format and sequence of every record, the
// SHA-256 hash chain; that the file opens with one run record; that every
// charge's recorded ε equals the run accountant's recomputation from the
// events recorded so far (within relative 1e-9); that every charge is for the
// mechanism the run record names (MechanismKind); that no recorded ε
// exceeds the target; that Raft indexes strictly increase; that applied
// (non-replay) steps strictly increase, so no step was applied twice; and
// that the ledger was not reused across Raft histories: every charge names
// the run record's history, and Raft terms never decrease from one charge
// to the next (they cannot along one Raft log; this also catches some
// reuse in ledgers written before history IDs, whose records carry none).
// An end record, if any, must be the only one, of the run's history, at or
// after the last charge's Raft index and term, and state exactly the steps
// charged as applied up to its step (1…EndStep); only replay charges may
// follow it. Steps charged as applied after its step are counted as
// Unapplied, not Applied; without an end record, the last step charged as
// applied is Unconfirmed. A torn tail is a problem: the file was cut, or
// a crash interrupted an append.
//
// It also composes all the charges with both accountants, RDP and PLD,
// and reports both ε beside the one the run enforced.
//
// It returns a report with OK false and the problems found for a ledger
// that fails any check; the error is non-nil only if the file cannot be
// read at all. Audit reads the file alone; Contents.Audit also takes what
// is known beside it (a live replica, the Raft state).
func Audit(path string) (AuditReport, error) {
	c, err := ReadContents(path)
	if err != nil {
		return AuditReport{Path: path}, err
	}
	return c.Audit(AuditOptions{}), nil
}

// Contents is one read of a ledger file: what ReadFile returned.
type Contents struct {
	Path      string
	Records   []Record
	TornBytes int64
	// Err is nil, or an error wrapping ErrCorrupt: Records then hold the
	// records that verified before the damage.
	Err error
}

// ReadContents reads the ledger file at path once without modifying it
// (ReadFile). The error is non-nil only if the file cannot be read at
// all; damage is in Contents.Err and Contents.TornBytes.
func ReadContents(path string) (Contents, error) {
	recs, torn, err := ReadFile(path)
	if err != nil && !errors.Is(err, ErrCorrupt) {
		return Contents{}, err
	}
	return Contents{Path: path, Records: recs, TornBytes: torn, Err: err}, nil
}

// AuditOptions is what an audit knows beside the ledger file. The zero
// value knows nothing: the file is audited alone, as Audit does.
type AuditOptions struct {
	// Live says a replica runs on the ledger's data dir now (it holds the
	// dir's Raft log open). Its ledger is audited up to its last complete
	// record: a torn tail is an append in progress, not a problem, and
	// Raft entries the replica logged and has not applied yet are not
	// records the ledger lacks.
	Live bool
	// Raft, if not nil, is the data dir's Raft state replayed. The ledger
	// must hold every record the replay wrote, with the same hash at the
	// same position: a ledger that lacks some (cut at a record boundary,
	// its end record lost) under-states what was spent, and fails.
	Raft *RaftReplay
}

// Audit audits c as Audit does, with what opts says beside it; the
// file's damage (Damage) is stated first among the problems.
func (c Contents) Audit(opts AuditOptions) AuditReport {
	rep := AuditReport{Path: c.Path, TornBytes: c.TornBytes, Live: opts.Live}
	recs := c.Records
	rep.Records = len(recs)
	cmp := compareRaft(recs, opts)
	rep.Raft, rep.Lacking, rep.Notes = cmp.replay, cmp.lacking, cmp.notes
	rep.Problems = append(rep.Problems, c.damage(opts, cmp)...)
	if len(recs) == 0 {
		if c.Err == nil {
			rep.Problems = append(rep.Problems, "ledger is empty: no run record")
		}
		return rep.finish()
	}
	rep.HeadHash = recs[len(recs)-1].Hash
	run := recs[0]
	if run.Kind != RecordRun {
		rep.Problems = append(rep.Problems, fmt.Sprintf("record 1 is a %q record, want the run record", run.Kind))
		return rep.finish()
	}
	a := newAuditor(&rep, run)
	if cmp.agrees && !opts.Live {
		a.raftApplied = &opts.Raft.Applied
	}
	for _, r := range recs[1:] {
		switch r.Kind {
		case RecordCharge:
			a.charge(r)
		case RecordEnd:
			a.end(r)
		default:
			a.problem("record %d: unexpected %q record", r.Seq, r.Kind)
		}
	}
	a.epsilons()
	a.steps()
	return rep.finish()
}

// auditor is Audit's state while it replays a run's charge records.
type auditor struct {
	rep            *AuditReport
	run            Record
	wantKind       accounting.Kind
	knownMechanism bool
	// rdp and pldEvents compose every charge afresh (RDPEpsilon,
	// PLDEpsilon); enforced replays the run's own budget.
	rdp       *accounting.RDPComposition
	pldEvents []accounting.PLDEvent
	pldErr    error
	enforced  *Replay
	// The Raft order of the charges seen so far.
	lastIndex, lastTerm uint64
	lastApplied         int64
	lastAppliedTerm     uint64
	recomputeFailed     bool
	rdpFailed           bool
	// applied holds the steps charged as applied, in file order; ended
	// the end record, if any.
	applied []int64
	ended   *Record
	// raftApplied, if not nil, is the last step the data dir's Raft
	// state applied, replayed, when the ledger holds exactly what the
	// replay wrote: it settles the applied steps of a run that wrote no
	// end record.
	raftApplied *int64
}

// newAuditor fills rep from the run record and returns the auditor of its
// charges.
func newAuditor(rep *AuditReport, run Record) *auditor {
	rep.Run, rep.TargetEpsilon, rep.Delta = run.Run, run.TargetEpsilon, run.Delta
	rep.Noise, rep.Private, rep.Mechanism = run.Noise, run.Noise != seed.Seeded, run.Mechanism
	rep.History = run.History
	if adm, ok := run.DatasetAdmission(); ok {
		rep.Admission = &adm
	}
	rep.Accountant = run.Accountant
	if rep.Accountant == "" {
		rep.Accountant = AccountantRDP
	}
	a := &auditor{rep: rep, run: run, rdp: accounting.RDP{}.NewComposition(), lastApplied: math.MinInt64}
	enforced, berr := NewReplay(run)
	if berr != nil {
		a.problem("record 1: %v", berr)
		b, _ := newBudget(AccountantRDP, run.Delta, run.TargetEpsilon)
		enforced = &Replay{b: b}
	}
	a.enforced = enforced
	a.wantKind, a.knownMechanism = MechanismKind(run.Mechanism)
	if !a.knownMechanism {
		a.problem("record 1: unknown noise mechanism %q", run.Mechanism)
	}
	return a
}

func (a *auditor) problem(format string, args ...any) {
	a.rep.Problems = append(a.rep.Problems, fmt.Sprintf(format, args...))
}

// charge audits one charge record: its ε, then its place in the Raft log.
func (a *auditor) charge(r Record) {
	a.rep.Charges++
	a.rep.RecordedEpsilon = r.Epsilon
	eps, ok := a.recompute(r)
	if !ok {
		return
	}
	a.order(r)
	a.rep.LastStep = max(a.rep.LastStep, r.Step)
	a.rep.RecomputedEpsilon = eps
}

// recompute composes r's event with every accountant and checks the ε it
// records against the run's own; ok is false if an accountant failed.
func (a *auditor) recompute(r Record) (eps float64, ok bool) {
	run := a.run
	if k := noiseKind(*r.Event); a.knownMechanism && k != a.wantKind {
		a.problem("record %d (step %d): charged a %q mechanism, the run's noise mechanism %q is charged as %q", r.Seq, r.Step, k, run.Mechanism, a.wantKind)
	}
	if err := a.rdp.Compose(*r.Event, 1); err != nil {
		a.problem("record %d: %v", r.Seq, err)
		a.rdpFailed, a.recomputeFailed = true, true
		return 0, false
	}
	if s, err := accounting.PLDStep(*r.Event); err != nil {
		a.pldErr = err
	} else {
		a.pldEvents = addPLDStep(a.pldEvents, s)
	}
	eps, err := a.enforced.Charge(*r.Event)
	if err != nil {
		a.problem("record %d: the %s accountant failed: %v", r.Seq, a.rep.Accountant, err)
		a.recomputeFailed = true
		return 0, false
	}
	if math.Abs(eps-r.Epsilon) > auditTolerance*math.Max(eps, 1e-12) {
		a.problem("record %d (step %d): recorded ε=%.12g, recomputed %.12g", r.Seq, r.Step, r.Epsilon, eps)
	}
	if r.Epsilon > run.TargetEpsilon || eps > run.TargetEpsilon {
		a.problem("record %d (step %d): ε=%.12g exceeds the target %v", r.Seq, r.Step, eps, run.TargetEpsilon)
	}
	return eps, true
}

// order checks r's Raft index, history and term against the charges
// before it, and counts it as a replay, a recharge or an applied step.
func (a *auditor) order(r Record) {
	if r.Index <= a.lastIndex {
		a.problem("record %d: Raft index %d does not follow %d", r.Seq, r.Index, a.lastIndex)
	}
	a.lastIndex = r.Index
	if r.History != a.run.History {
		a.problem("record %d (step %d): charge from Raft history %s, but the run record binds the ledger to history %s: the ledger was reused across Raft histories",
			r.Seq, r.Step, historyName(r.History), historyName(a.run.History))
	}
	if r.Term < a.lastTerm {
		a.problem("record %d (step %d): Raft term %d after term %d: terms never decrease along one Raft log, so the ledger was reused across Raft histories",
			r.Seq, r.Step, r.Term, a.lastTerm)
	}
	a.lastTerm = max(a.lastTerm, r.Term)
	switch {
	case r.Replay:
		a.rep.Replays++
	case r.Step == a.lastApplied && r.Term > a.lastAppliedTerm:
		// Charged again by a later term's leader: the first charge's
		// g̃ never committed (charge-ahead). Within one term a leader
		// charges each step once.
		a.rep.Recharges++
		a.lastAppliedTerm = r.Term
	default:
		if r.Step <= a.lastApplied {
			a.problem("record %d: step %d applied after step %d in term %d", r.Seq, r.Step, a.lastApplied, a.lastAppliedTerm)
		}
		if a.ended != nil {
			a.problem("record %d: step %d charged as applied after the run ended (record %d)", r.Seq, r.Step, a.ended.Seq)
		}
		a.lastApplied, a.lastAppliedTerm = r.Step, r.Term
		a.applied = append(a.applied, r.Step)
	}
}

// end audits the end record r: the only one, of the run's history, not
// before the last charge in the Raft log.
func (a *auditor) end(r Record) {
	switch {
	case a.ended != nil:
		a.problem("record %d: a second end record (the first is record %d)", r.Seq, a.ended.Seq)
		return
	case r.History != a.run.History:
		a.problem("record %d: end from Raft history %s, but the run record binds the ledger to history %s",
			r.Seq, historyName(r.History), historyName(a.run.History))
	case r.Index < a.lastIndex || r.Term < a.lastTerm:
		a.problem("record %d: end at Raft term %d, index %d, before the last charge (term %d, index %d)",
			r.Seq, r.Term, r.Index, a.lastTerm, a.lastIndex)
	}
	a.ended = &r
	a.rep.Ended, a.rep.EndStep, a.rep.EndReason = true, r.Step, r.Reason
}

// steps counts the applied steps. With an end record, the steps charged
// as applied up to its step, which must be exactly 1…EndStep, are
// applied and those after it unapplied; the same with the last step the
// Raft state's replay applied, for a run that wrote none. Otherwise every
// step charged as applied is, but the last, which is unconfirmed: it may
// have been charged ahead of its g̃.
func (a *auditor) steps() {
	rep := a.rep
	var last int64
	switch {
	case a.ended != nil:
		last = a.ended.Step
	case a.raftApplied != nil:
		last = *a.raftApplied
	default:
		rep.Applied = len(a.applied)
		if rep.Applied > 0 {
			rep.Applied, rep.Unconfirmed = rep.Applied-1, 1
		}
		return
	}
	for _, s := range a.applied {
		if s <= last {
			rep.Applied++
		} else {
			rep.Unapplied++
		}
	}
	switch {
	case int64(rep.Applied) == last:
	case a.ended != nil:
		a.problem("record %d: the run ended at step %d (%s), but the ledger charges %d steps as applied up to it",
			a.ended.Seq, a.ended.Step, a.ended.Reason, rep.Applied)
	default:
		a.problem("the Raft state applied steps 1–%d, but the ledger charges %d steps as applied up to step %d", last, rep.Applied, last)
	}
}

// ExpectSteps adds a problem to r unless exactly n steps were applied,
// confirmed: an unconfirmed step (a ledger read alone, without an end
// record) may or may not have been applied, so it confirms no count.
func (r *AuditReport) ExpectSteps(n int) {
	switch {
	case r.Unconfirmed > 0:
		r.Problems = append(r.Problems, fmt.Sprintf("%d applied steps and step %d unconfirmed (charged without an end record: perhaps charged ahead of its g̃ and never applied), --expect-steps %d: audit the replica's data dir, whose Raft state settles it",
			r.Applied, r.LastStep, n))
	case r.Applied != n:
		r.Problems = append(r.Problems, fmt.Sprintf("%d applied steps, --expect-steps %d", r.Applied, n))
	default:
		return
	}
	r.OK = false
}

// epsilons fills the report's RDP and PLD ε of all the charges and checks
// a PLD ledger's recorded ε against the PLD accountant's.
func (a *auditor) epsilons() {
	rep, run := a.rep, a.run
	// An accountant that failed reports +Inf (null in JSON), never 0 or
	// the value before the record it failed on.
	if a.recomputeFailed {
		rep.RecomputedEpsilon = math.Inf(1)
	}
	if rep.Charges > 0 {
		rep.RDPEpsilon = math.Inf(1)
		if e, _, err := a.rdp.Epsilon(run.Delta); err == nil && !a.rdpFailed {
			rep.RDPEpsilon = e
		}
	}
	switch {
	case a.pldErr != nil:
		rep.PLDNote = a.pldErr.Error()
	case len(a.pldEvents) == 0:
		rep.PLDNote = "no charges"
	default:
		e, err := accounting.PLD{}.EpsilonSteps(a.pldEvents, run.Delta)
		if err != nil {
			rep.PLDNote = err.Error()
			e = math.Inf(1)
		}
		rep.PLDEpsilon = &e
		// A PLD ledger records the accountant's ε at its count grid,
		// at least the ε of the charges taken and at most PLDGridRatio
		// times it (pldSeries).
		if rep.Accountant == AccountantPLD && err == nil &&
			(rep.RecordedEpsilon < e*(1-accounting.PLDNumericError) || rep.RecordedEpsilon > e*PLDGridRatio*(1+auditTolerance)) {
			a.problem("recorded ε=%.12g is not within [1, %v] × the PLD accountant's ε of the %d charges, %.12g",
				rep.RecordedEpsilon, PLDGridRatio, rep.Charges, e)
		}
	}
}

// noiseKind returns the kind of the noise-adding mechanism inside e: the
// inner event of a Poisson-sampled one, or e's own kind.
func noiseKind(e accounting.Event) accounting.Kind {
	if e.Kind == accounting.KindPoissonSampled && e.Event != nil {
		return e.Event.Kind
	}
	return e.Kind
}

func (r AuditReport) finish() AuditReport {
	r.OK = len(r.Problems) == 0
	if r.Problems == nil {
		r.Problems = []string{}
	}
	return r
}

// auditJSON is AuditReport's JSON form: ε that is not finite (an
// accountant that failed: +Inf) is null, which encoding/json cannot
// write for a float64, and reads back as +Inf.
type auditJSON struct {
	plainAudit
	RecomputedEpsilon jsonEpsilon  `json:"recomputed_epsilon"`
	RDPEpsilon        jsonEpsilon  `json:"rdp_epsilon"`
	PLDEpsilon        *jsonEpsilon `json:"pld_epsilon"`
}

type plainAudit AuditReport

// MarshalJSON writes the report with non-finite ε as null.
func (r AuditReport) MarshalJSON() ([]byte, error) {
	j := auditJSON{plainAudit: plainAudit(r), RecomputedEpsilon: jsonEpsilon(r.RecomputedEpsilon), RDPEpsilon: jsonEpsilon(r.RDPEpsilon)}
	if r.PLDEpsilon != nil {
		e := jsonEpsilon(*r.PLDEpsilon)
		j.PLDEpsilon = &e
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes, null ε as +Inf.
func (r *AuditReport) UnmarshalJSON(b []byte) error {
	var j auditJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = AuditReport(j.plainAudit)
	r.RecomputedEpsilon, r.RDPEpsilon = float64(j.RecomputedEpsilon), float64(j.RDPEpsilon)
	r.PLDEpsilon = nil
	if j.PLDEpsilon != nil {
		e := float64(*j.PLDEpsilon)
		r.PLDEpsilon = &e
	}
	return nil
}

// jsonEpsilon is an ε in JSON: a number, or null when not finite.
type jsonEpsilon float64

func (e jsonEpsilon) MarshalJSON() ([]byte, error) {
	if math.IsInf(float64(e), 0) || math.IsNaN(float64(e)) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(e))
}

func (e *jsonEpsilon) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*e = jsonEpsilon(math.Inf(1))
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*e = jsonEpsilon(v)
	return nil
}

// Replay recomputes, charge by charge, the ε a ledger records: what the
// ledger of a run record run holds after each charge, by the run record's
// accountant and rules (for a PLD run, the count grid). Audit checks every
// record with it; tools that build or check ledgers use it too.
type Replay struct{ b budget }

// NewReplay returns a Replay for a ledger whose run record is run.
func NewReplay(run Record) (*Replay, error) {
	if run.Kind != RecordRun {
		return nil, fmt.Errorf("%w: a %q record is not a run record", ErrInvalidParameter, run.Kind)
	}
	b, err := newBudget(run.Accountant, run.Delta, run.TargetEpsilon)
	if err != nil {
		return nil, err
	}
	return &Replay{b: b}, nil
}

// Charge composes one more charge of e and returns the ε its record holds.
func (r *Replay) Charge(e accounting.Event) (float64, error) {
	if err := r.b.add(e); err != nil {
		return 0, err
	}
	return r.b.epsilon()
}

package ledger

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/dpcluster/dpcluster/accounting"
)

// ErrDatasetBudget is returned (wrapped, with the dataset, its budget and
// what remains) by DatasetBudget.Admit for a run whose plan would take the
// dataset past its lifetime budget. Nothing is recorded.
var ErrDatasetBudget = errors.New("ledger: the dataset's lifetime privacy budget does not allow this run")

// A DatasetBudget is the privacy odometer of one training set: a lifetime
// (ε, δ) its owner sets for the data, identified by its content hash, and
// every run that trained on it, composed by the PLD accountant (not by
// adding ε's). It is a file of its own (DatasetBudgetFile) in the ledger's
// format: CRC-framed, SHA-256 hash-chained, fsynced records, audited by
// AuditDatasetBudget. Its records:
//
//   - budget (first): the dataset's hash and label, the lifetime ε
//     (TargetEpsilon) and δ, and the budget's random ID (BudgetID);
//   - admit: a run may start. Its admission's random ID (AdmissionID),
//     the run's name and ledger path, its step's event and Count, the
//     most charges its own ledger can ever make (its step limit at its
//     target ε, StepLimit). Recorded before the run's first release, and
//     only if composing every run's charges with this reservation stays
//     within the lifetime ε. The run's configuration carries the
//     admission (Admission), so its ledger's run record names it;
//   - settle: the run stopped after Count charges; its ledger's Raft
//     history (History) and head hash (Head) at that point. A settled run
//     counts for its charges, an admitted one that has not settled
//     (running, or crashed) for its whole reservation: when in doubt,
//     over-count. A settle with no charges and no head is a withdrawn
//     admission: its run never started.
//
// A run is its admission, not its name or its directory: a run resumes
// under its admission only when its ledger's run record names it and the
// ledger extends what was settled (same history, holds the settled head);
// a ledger without a run record gets a new admission, so a data directory
// wiped and reused, or a run name reused, is a new run, and the one before
// keeps what it spent or reserved.
//
// Every admit and settle record holds, in Epsilon, the dataset's ε after
// it: the PLD accountant's ε of all runs' counted charges at the budget's
// δ. It is not safe for concurrent use.
type DatasetBudget struct {
	file   *File
	budget Record
	runs   []*datasetRun // in first-admitted order
	spent  float64
}

// datasetRun is one run (one admission) of a dataset budget.
type datasetRun struct {
	run, ledger string
	// admission is the admission's ID; "" for one recorded before IDs,
	// which is keyed by run and ledger path instead.
	admission string
	event     accounting.Event
	reserved  int64 // the admission's Count
	charges   int64 // the last settle's Count
	open      bool  // admitted and not settled since
	// history and head are the last settle's ledger history and head
	// hash ("" before any settle, and after a withdrawal).
	history, head string
	settled       bool // settled at least once
}

// counted returns the charges the run counts for.
func (r *datasetRun) counted() int64 {
	if r.open {
		return r.reserved
	}
	return r.charges
}

var datasetHash = regexp.MustCompile(`^[0-9a-f]{64}$`)

// DatasetBudgetFile returns the path of the budget file of the dataset
// whose content hash is dataset (lower-case hex SHA-256) in dir.
func DatasetBudgetFile(dir, dataset string) string {
	return filepath.Join(dir, dataset+".budget")
}

// CreateDatasetBudget writes a new budget file for dataset (its content
// hash; label is what its owner calls it) in dir, with a lifetime budget
// of epsilon at delta, and returns its path. It refuses to replace an
// existing one: a dataset's budget is set once (ErrRunMismatch).
func CreateDatasetBudget(dir, dataset, label string, epsilon, delta float64) (string, error) {
	id, err := newRandomID()
	if err != nil {
		return "", err
	}
	return createDatasetBudget(dir, Record{Kind: RecordBudget, Dataset: dataset, Label: label, TargetEpsilon: epsilon, Delta: delta,
		Accountant: AccountantPLD, BudgetID: id})
}

// createDatasetBudget writes a budget file whose first record is rec.
func createDatasetBudget(dir string, rec Record) (string, error) {
	dataset, epsilon, delta := rec.Dataset, rec.TargetEpsilon, rec.Delta
	switch {
	case !datasetHash.MatchString(dataset):
		return "", fmt.Errorf("%w: dataset hash %q must be 64 lower-case hex digits (SHA-256)", ErrInvalidParameter, dataset)
	case !(epsilon > 0) || math.IsInf(epsilon, 0):
		return "", fmt.Errorf("%w: lifetime ε %v must be positive and finite", ErrInvalidParameter, epsilon)
	case !(delta > 0 && delta < 1):
		return "", fmt.Errorf("%w: δ %v must be in (0, 1)", ErrInvalidParameter, delta)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := DatasetBudgetFile(dir, dataset)
	if _, err := os.Stat(path); err == nil {
		return "", fmt.Errorf("%w: dataset %s already has a budget in %s", ErrRunMismatch, short(dataset), path)
	}
	f, _, err := OpenFile(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = f.Append(rec)
	return path, err
}

// OpenDatasetBudget opens the budget file at path (repairing a torn tail,
// as OpenFile does) and replays it.
func OpenDatasetBudget(path string) (*DatasetBudget, error) {
	b := &DatasetBudget{}
	f, err := openAndReplay(path, nil, b.replay)
	if err != nil {
		return nil, err
	}
	b.file = f
	return b, nil
}

// replay rebuilds the budget's state from verified records.
func (b *DatasetBudget) replay(recs []Record) error {
	if len(recs) == 0 || recs[0].Kind != RecordBudget {
		return fmt.Errorf("%w: a dataset budget file must open with a budget record", ErrCorrupt)
	}
	b.budget = recs[0]
	for _, r := range recs[1:] {
		if err := b.apply(r); err != nil {
			return fmt.Errorf("%w: record %d: %v", ErrCorrupt, r.Seq, err)
		}
		b.spent = r.Epsilon
	}
	return nil
}

// apply updates the runs with an admit or settle record.
func (b *DatasetBudget) apply(r Record) error {
	switch r.Kind {
	case RecordAdmit:
		if r.Count < 1 {
			return fmt.Errorf("admission of run %q reserves %d charges", r.Run, r.Count)
		}
		if _, err := accounting.PLDStep(*r.Event); err != nil {
			return err
		}
		if dr := b.find(r.AdmissionID, r.Run, r.Ledger); dr != nil {
			switch {
			case dr.run != r.Run:
				return fmt.Errorf("admission %s of run %q admitted again for run %q", short(dr.admission), dr.run, r.Run)
			case !sameEvent(dr.event, *r.Event):
				return fmt.Errorf("run %q admitted again with another mechanism", r.Run)
			case r.Count < dr.charges:
				return fmt.Errorf("run %q admitted again for %d charges after making %d", r.Run, r.Count, dr.charges)
			case dr.settled && dr.head == "" && dr.admission != "":
				return fmt.Errorf("run %q admitted again after its admission was withdrawn", r.Run)
			}
			dr.reserved, dr.open, dr.ledger = r.Count, true, r.Ledger
			return nil
		}
		b.runs = append(b.runs, &datasetRun{run: r.Run, ledger: r.Ledger, admission: r.AdmissionID, event: *r.Event, reserved: r.Count, open: true})
	case RecordSettle:
		dr := b.find(r.AdmissionID, r.Run, r.Ledger)
		if dr == nil {
			return fmt.Errorf("settles run %q, which was never admitted", r.Run)
		}
		if r.Count < dr.charges {
			return fmt.Errorf("run %q settles %d charges after %d", r.Run, r.Count, dr.charges)
		}
		dr.charges, dr.open, dr.settled, dr.history, dr.head = r.Count, false, true, r.History, r.Head
	default:
		return fmt.Errorf("a %q record in a dataset budget", r.Kind)
	}
	return nil
}

func sameEvent(a, b accounting.Event) bool {
	ka, errA := accounting.PLDStep(a)
	kb, errB := accounting.PLDStep(b)
	return errA == nil && errB == nil && keyOf(ka) == keyOf(kb)
}

// find returns the run of the admission with ID admission, or, for ""
// (records from before admission IDs), the run of that name and ledger
// path admitted without an ID; nil if there is none.
func (b *DatasetBudget) find(admission, run, ledger string) *datasetRun {
	for _, r := range b.runs {
		if r.admission == admission && (admission != "" || r.run == run && r.ledger == ledger) {
			return r
		}
	}
	return nil
}

// ID returns the budget's identity: the random ID drawn when it was
// created, or, for a budget from before those, its budget record's hash.
// A budget created again after its file was lost has another ID, so the
// ledgers of the runs the lost file counted do not match it.
func (b *DatasetBudget) ID() string {
	if b.budget.BudgetID != "" {
		return b.budget.BudgetID
	}
	return b.budget.Hash
}

// events returns the PLD events every run counts for, with extra more
// charges of extra's event.
func (b *DatasetBudget) events(extra *accounting.Event, count int64) ([]accounting.PLDEvent, error) {
	var evs []accounting.PLDEvent
	add := func(e accounting.Event, n int64) error {
		if n <= 0 {
			return nil
		}
		s, err := accounting.PLDStep(e)
		if err != nil {
			return err
		}
		for i := range evs {
			if keyOf(evs[i]) == keyOf(s) {
				evs[i].Count += n
				return nil
			}
		}
		s.Count = n
		evs = append(evs, s)
		return nil
	}
	for _, r := range b.runs {
		if err := add(r.event, r.counted()); err != nil {
			return nil, err
		}
	}
	if extra != nil {
		if err := add(*extra, count); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// epsilonWith returns the dataset's ε with count more charges of e (e nil:
// none); 0 with nothing counted.
func (b *DatasetBudget) epsilonWith(e *accounting.Event, count int64) (float64, error) {
	evs, err := b.events(e, count)
	if err != nil || len(evs) == 0 {
		return 0, err
	}
	return accounting.PLD{}.EpsilonSteps(evs, b.budget.Delta)
}

// ErrAdmission is returned (wrapped, with what the ledger and the budget
// hold) by DatasetBudget.Admit and Settle when a run's ledger does not
// belong to the admission it is asked about: a ledger of a run started
// without a dataset budget, or admitted to another budget or dataset, or
// one that does not extend what its admission settled (a different
// ledger in the same place). Nothing is recorded.
var ErrAdmission = errors.New("ledger: the run's ledger does not match its dataset budget admission")

// Admit admits run, whose ledger is rl (ReadRunLedger of the path its
// replica keeps it at), to train on the dataset, charging at most
// maxCharges of step (its step limit: StepLimit), if every run's counted
// charges composed with those stay within the lifetime ε; otherwise it
// records nothing and returns an error wrapping ErrDatasetBudget that
// names the dataset, its budget, what the runs so far spent and how many
// charges of step the budget still allows. It returns the admission, which
// the run's configuration must carry (its ledger's run record then states
// it).
//
// A ledger with no run record (a new run, or a data directory whose run
// never started) gets a new admission. A ledger with one is resumed under
// the admission its run record names, which must be one of this budget's
// for this run, and the ledger must extend what that admission last
// settled (the same Raft history, holding the settled head hash):
// anything else is ErrAdmission. A resumed run already admitted and not
// settled is admitted again only if its reservation grew. Call it before
// the run's first release.
func (b *DatasetBudget) Admit(run string, rl RunLedger, step accounting.Event, maxCharges int64) (Admission, error) {
	if maxCharges < 1 {
		return Admission{}, fmt.Errorf("%w: a run must reserve at least one charge, not %d", ErrInvalidParameter, maxCharges)
	}
	if _, err := accounting.PLDStep(step); err != nil {
		return Admission{}, fmt.Errorf("the dataset budget composes runs with the PLD accountant: %w", err)
	}
	var dr *datasetRun
	adm := Admission{Dataset: b.budget.Dataset, Budget: b.ID(), File: b.file.Path(), Epsilon: b.budget.TargetEpsilon, Delta: b.budget.Delta}
	if abs, err := filepath.Abs(adm.File); err == nil {
		adm.File = abs
	}
	if rl.Run != nil {
		var err error
		if dr, adm, err = b.resumed(run, rl); err != nil {
			return Admission{}, err
		}
		if !sameEvent(dr.event, step) {
			return Admission{}, fmt.Errorf("%w: run %q (ledger %s) was admitted with another mechanism (%s)", ErrRunMismatch, run, rl.Path, dr.event.Describe())
		}
		if dr.open && dr.reserved >= maxCharges {
			return adm, nil // already admitted for as much
		}
	} else {
		id, err := newRandomID()
		if err != nil {
			return Admission{}, err
		}
		adm.ID = id
	}
	// The new reservation replaces what the run counted so far (it
	// covers the run's earlier charges: they are in its ledger too).
	var saved datasetRun
	if dr != nil {
		maxCharges = max(maxCharges, dr.charges)
		saved = *dr
		dr.reserved, dr.open = 0, true
		defer func() { *dr = saved }()
	}
	prior, err := b.epsilonWith(nil, 0)
	if err != nil {
		return Admission{}, err
	}
	after, err := b.epsilonWith(&step, maxCharges)
	if err != nil {
		return Admission{}, err
	}
	if after > b.budget.TargetEpsilon {
		room, err := b.room(step)
		if err != nil {
			return Admission{}, err
		}
		s, _ := accounting.PLDStep(step)
		return Admission{}, fmt.Errorf("%w: dataset %s (sha256 %s) has a lifetime budget of ε = %.4g at δ = %g; its runs so far count for ε = %.4g, and run %q may charge up to %d steps (q = %.6g, σ = %.6g), which would take it to ε = %.4g. The budget leaves room for at most %d such steps: lower --max-steps or --target-epsilon, or raise σ",
			ErrDatasetBudget, orDashLabel(b.budget.Label), short(b.budget.Dataset), b.budget.TargetEpsilon, b.budget.Delta, prior, run, maxCharges, s.SampleRate, s.NoiseMultiplier, after, room)
	}
	if _, err := b.file.Append(Record{Kind: RecordAdmit, Run: run, Ledger: rl.Path, AdmissionID: adm.ID, Event: &step, Count: maxCharges, Epsilon: after}); err != nil {
		return Admission{}, err
	}
	if dr != nil {
		saved.reserved, saved.open, saved.ledger = maxCharges, true, rl.Path
	} else {
		b.runs = append(b.runs, &datasetRun{run: run, ledger: rl.Path, admission: adm.ID, event: step, reserved: maxCharges, open: true})
	}
	b.spent = after
	return adm, nil
}

// resumed returns the admission of run, whose ledger rl holds a run
// record, and the budget's state of it: the admission the run record
// names, which must be this budget's, for this dataset and run, and whose
// last settled ledger rl extends (ErrAdmission otherwise).
func (b *DatasetBudget) resumed(run string, rl RunLedger) (*datasetRun, Admission, error) {
	a, ok := rl.Run.DatasetAdmission()
	switch {
	case !ok:
		return nil, a, fmt.Errorf("%w: the ledger %s holds run %q, which was started without a dataset budget: a run is admitted before its first release, so this one cannot be admitted now; train a new run in a new data directory",
			ErrAdmission, rl.Path, rl.Run.Run)
	case a.Dataset != b.budget.Dataset:
		return nil, a, fmt.Errorf("%w: the ledger %s holds run %q, admitted to train on dataset %s; this budget is dataset %s's: the training data is not the data the run started on",
			ErrAdmission, rl.Path, rl.Run.Run, short(a.Dataset), short(b.budget.Dataset))
	case a.Budget != b.ID():
		return nil, a, fmt.Errorf("%w: the ledger %s holds run %q, admitted to budget %s of dataset %s (lifetime ε = %g, file %s); this budget (%s, %s) is another: resume the run with the budget that admitted it, or rebuild that budget from its runs' ledgers (coordinator ledger budget rebuild)",
			ErrAdmission, rl.Path, rl.Run.Run, short(a.Budget), short(a.Dataset), a.Epsilon, a.File, short(b.ID()), b.file.Path())
	}
	dr := b.find(a.ID, "", "")
	switch {
	case dr == nil:
		return nil, a, fmt.Errorf("%w: the ledger %s holds run %q, admitted as %s, which budget %s does not hold: the budget file was rebuilt or copied without it",
			ErrAdmission, rl.Path, rl.Run.Run, short(a.ID), b.file.Path())
	case dr.run != run || rl.Run.Run != run:
		return nil, a, fmt.Errorf("%w: admission %s is run %q's; asked to admit run %q with the ledger of run %q", ErrAdmission, short(a.ID), dr.run, run, rl.Run.Run)
	case dr.settled && dr.head == "":
		return nil, a, fmt.Errorf("%w: admission %s of run %q was withdrawn (its run never started), yet the ledger %s holds its run record", ErrAdmission, short(a.ID), run, rl.Path)
	case dr.settled && (rl.History() != dr.history || !rl.Holds(dr.head)):
		return nil, a, fmt.Errorf("%w: the ledger %s does not extend what admission %s of run %q settled (%d charges, Raft history %s, head %s): it holds %d charges of history %s; it is not the ledger that was settled",
			ErrAdmission, rl.Path, short(a.ID), run, dr.charges, historyName(dr.history), short(dr.head), rl.Charges, historyName(rl.History()))
	}
	return dr, a, nil
}

// room returns the most charges of step the budget allows on top of what
// the runs count for now (0 if none).
func (b *DatasetBudget) room(step accounting.Event) (int64, error) {
	ok := func(n int64) (bool, error) {
		e, err := b.epsilonWith(&step, n)
		return e <= b.budget.TargetEpsilon, err
	}
	if good, err := ok(1); err != nil || !good {
		return 0, err
	}
	lo, hi := int64(1), int64(2)
	for {
		good, err := ok(hi)
		if err != nil {
			return 0, err
		}
		if !good {
			break
		}
		if hi >= accounting.MaxStepLimit {
			return accounting.MaxStepLimit, nil
		}
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		good, err := ok(mid)
		if err != nil {
			return 0, err
		}
		if good {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// Settle records that the run of admission id stopped with its ledger as
// rl holds it: from now on it counts for rl's charges instead of its
// reservation. rl's run record must name the admission and rl must extend
// what it last settled (ErrAdmission); a ledger with no run record is
// ErrAdmission too (a run that vanished keeps its reservation: Withdraw is
// for one that never started). A run not admitted is an error; so is a
// settle with fewer charges than before or more than reserved. Settling
// what is already settled records nothing.
func (b *DatasetBudget) Settle(id string, rl RunLedger) (Record, error) {
	dr := b.find(id, "", "")
	if dr == nil || id == "" {
		return Record{}, fmt.Errorf("%w: admission %q was never made by dataset %s's budget", ErrInvalidParameter, id, short(b.budget.Dataset))
	}
	if rl.Run == nil {
		return Record{}, fmt.Errorf("%w: run %q's ledger %s holds no run record: the run keeps its whole reservation", ErrAdmission, dr.run, rl.Path)
	}
	if a, ok := rl.Run.DatasetAdmission(); !ok || a.ID != id || a.Budget != b.ID() || rl.Run.Run != dr.run {
		return Record{}, fmt.Errorf("%w: the ledger %s holds run %q with admission %s, not run %q's %s", ErrAdmission, rl.Path, rl.Run.Run, admissionName(a, ok), dr.run, short(id))
	}
	if dr.settled && (rl.History() != dr.history || !rl.Holds(dr.head)) {
		return Record{}, fmt.Errorf("%w: the ledger %s does not extend what run %q settled", ErrAdmission, rl.Path, dr.run)
	}
	return b.settle(dr, rl.Charges, rl.Path, rl.History(), rl.Head())
}

// Withdraw settles the admission id at no charges: its run never started,
// so its ledger (rl) holds no run record. The caller must know that the
// run's replica never applied its configuration: from the budget's side,
// a run that never started and one whose ledger was deleted look alike.
// Only an admission that never settled may be withdrawn.
func (b *DatasetBudget) Withdraw(id string, rl RunLedger) (Record, error) {
	dr := b.find(id, "", "")
	switch {
	case dr == nil || id == "":
		return Record{}, fmt.Errorf("%w: admission %q was never made by dataset %s's budget", ErrInvalidParameter, id, short(b.budget.Dataset))
	case rl.Run != nil:
		return Record{}, fmt.Errorf("%w: the ledger %s holds run %q's run record: its run started", ErrAdmission, rl.Path, rl.Run.Run)
	case dr.settled:
		return Record{}, fmt.Errorf("%w: admission %s of run %q settled before: its run started", ErrInvalidParameter, short(id), dr.run)
	}
	return b.settle(dr, 0, rl.Path, "", "")
}

// settle records that dr counts for charges from now on.
func (b *DatasetBudget) settle(dr *datasetRun, charges int64, ledgerPath, history, head string) (Record, error) {
	switch {
	case charges < dr.charges || dr.open && charges > dr.reserved:
		return Record{}, fmt.Errorf("%w: run %q settles %d charges; it had %d and reserved %d", ErrInvalidParameter, dr.run, charges, dr.charges, dr.reserved)
	case !dr.open && charges == dr.charges && head == dr.head:
		h, _ := b.file.Head() // nothing new
		return h, nil
	}
	saved := *dr
	dr.charges, dr.open, dr.settled, dr.history, dr.head = charges, false, true, history, head
	after, err := b.epsilonWith(nil, 0)
	if err == nil {
		var r Record
		r, err = b.file.Append(Record{Kind: RecordSettle, Run: dr.run, Ledger: ledgerPath, AdmissionID: dr.admission, Count: charges,
			History: history, Head: head, Epsilon: after})
		if err == nil {
			b.spent = after
			return r, nil
		}
	}
	*dr = saved
	return Record{}, err
}

// Spent returns the dataset's ε as its last record holds it (0 before
// any run): every run's counted charges composed.
func (b *DatasetBudget) Spent() float64 { return b.spent }

// Budget returns the budget record: the dataset, its label, the lifetime
// ε (TargetEpsilon) and δ.
func (b *DatasetBudget) Budget() Record { return b.budget }

// Path returns the budget file's path.
func (b *DatasetBudget) Path() string { return b.file.Path() }

// Close closes the budget file.
func (b *DatasetBudget) Close() error { return b.file.Close() }

// DatasetAudit is the result of auditing a dataset budget file.
type DatasetAudit struct {
	Path     string   `json:"path"`
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"`
	Dataset  string   `json:"dataset"`
	// BudgetID is the budget's identity (DatasetBudget.ID), which its
	// runs' ledgers name.
	BudgetID        string  `json:"budget_id"`
	Label           string  `json:"label"`
	LifetimeEpsilon float64 `json:"lifetime_epsilon"`
	Delta           float64 `json:"delta"`
	Records         int     `json:"records"`
	// Runs lists every run admitted, in first-admitted order.
	Runs []DatasetRunReport `json:"runs"`
	// RecordedEpsilon is the last record's ε, RecomputedEpsilon the
	// audit's composition of every run's counted charges.
	RecordedEpsilon   float64 `json:"recorded_epsilon"`
	RecomputedEpsilon float64 `json:"recomputed_epsilon"`
	HeadHash          string  `json:"head_hash"`
	TornBytes         int64   `json:"torn_bytes"`
}

// DatasetRunReport is one run of a dataset budget as the audit sees it.
type DatasetRunReport struct {
	Run    string `json:"run"`
	Ledger string `json:"ledger"`
	// Admission is the admission's ID ("" for one from before IDs);
	// History and Head the ledger's Raft history and head hash when the
	// run last settled ("" before).
	Admission string           `json:"admission"`
	History   string           `json:"history,omitempty"`
	Head      string           `json:"head,omitempty"`
	Event     accounting.Event `json:"event"`
	Reserved  int64            `json:"reserved"`
	Charges   int64            `json:"charges"`
	// Open is true for a run admitted and not settled since: it counts
	// for its whole reservation.
	Open bool `json:"open"`
}

// AuditDatasetBudget reads the budget file at path without modifying it
// and checks every frame's CRC, the hash chain, that it opens with a budget
// record, that every admit and settle record is consistent with the runs
// before it (ReadFile and DatasetBudget's rules), that every record's ε is
// the PLD composition of the runs' counted charges at that point (within
// relative 1e-9), and that no admission took the dataset past its lifetime
// ε. The error is non-nil only if the file cannot be read at all.
func AuditDatasetBudget(path string) (DatasetAudit, error) {
	rep := DatasetAudit{Path: path, Problems: []string{}, Runs: []DatasetRunReport{}}
	recs, torn, err := ReadFile(path)
	rep.TornBytes, rep.Records = torn, len(recs)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			return rep, err
		}
		rep.Problems = append(rep.Problems, err.Error())
	}
	if len(recs) == 0 || recs[0].Kind != RecordBudget {
		rep.Problems = append(rep.Problems, "the file does not open with a budget record")
		return rep, nil
	}
	rep.HeadHash = recs[len(recs)-1].Hash
	b := &DatasetBudget{budget: recs[0]}
	rep.Dataset, rep.Label, rep.LifetimeEpsilon, rep.Delta = b.budget.Dataset, b.budget.Label, b.budget.TargetEpsilon, b.budget.Delta
	rep.BudgetID = b.ID()
	if !datasetHash.MatchString(rep.Dataset) {
		rep.Problems = append(rep.Problems, fmt.Sprintf("record 1: dataset hash %q is not a SHA-256", rep.Dataset))
	}
	for _, r := range recs[1:] {
		rep.RecordedEpsilon = r.Epsilon
		if err := b.apply(r); err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: %v", r.Seq, err))
			rep.RecomputedEpsilon = math.Inf(1)
			continue
		}
		eps, err := b.epsilonWith(nil, 0)
		if err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: the PLD accountant failed: %v", r.Seq, err))
			rep.RecomputedEpsilon = math.Inf(1)
			continue
		}
		if math.Abs(eps-r.Epsilon) > auditTolerance*math.Max(eps, 1e-12) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d (%s of run %q): recorded ε=%.12g, recomputed %.12g", r.Seq, r.Kind, r.Run, r.Epsilon, eps))
		}
		if r.Kind == RecordAdmit && eps > b.budget.TargetEpsilon {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: admitting run %q took the dataset to ε=%.12g, past its lifetime ε=%v", r.Seq, r.Run, eps, b.budget.TargetEpsilon))
		}
		if !math.IsInf(rep.RecomputedEpsilon, 1) {
			rep.RecomputedEpsilon = eps
		}
	}
	for _, r := range b.runs {
		rep.Runs = append(rep.Runs, DatasetRunReport{Run: r.run, Ledger: r.ledger, Admission: r.admission, History: r.history, Head: r.head,
			Event: r.event, Reserved: r.reserved, Charges: r.charges, Open: r.open})
	}
	rep.OK = len(rep.Problems) == 0
	return rep, nil
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func orDashLabel(s string) string {
	if strings.TrimSpace(s) == "" {
		return "(no label)"
	}
	return fmt.Sprintf("%q", s)
}

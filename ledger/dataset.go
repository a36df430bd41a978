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
//     (TargetEpsilon) and δ;
//   - admit: a run (Run, and Ledger: the path of its ledger) may start: its
//     step's event and Count, the most charges its own ledger can ever make
//     (its step limit at its target ε, StepLimit). Recorded before the run's
//     first release, and only if composing every run's charges with this
//     reservation stays within the lifetime ε;
//   - settle: the run stopped after Count charges (its ledger's head hash in
//     Head). A settled run counts for its charges, an admitted one that has
//     not settled (running, or crashed) for its whole reservation: when in
//     doubt, over-count. A resumed run is admitted again.
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

// datasetRun is one run of a dataset budget.
type datasetRun struct {
	run, ledger string
	event       accounting.Event
	reserved    int64 // the admission's Count
	charges     int64 // the last settle's Count
	open        bool  // admitted and not settled since
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
	_, err = f.Append(Record{Kind: RecordBudget, Dataset: dataset, Label: label, TargetEpsilon: epsilon, Delta: delta, Accountant: AccountantPLD})
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
		if dr := b.find(r.Run, r.Ledger); dr != nil {
			if !sameEvent(dr.event, *r.Event) {
				return fmt.Errorf("run %q admitted again with another mechanism", r.Run)
			}
			if r.Count < dr.charges {
				return fmt.Errorf("run %q admitted again for %d charges after making %d", r.Run, r.Count, dr.charges)
			}
			dr.reserved, dr.open = r.Count, true
			return nil
		}
		b.runs = append(b.runs, &datasetRun{run: r.Run, ledger: r.Ledger, event: *r.Event, reserved: r.Count, open: true})
	case RecordSettle:
		dr := b.find(r.Run, r.Ledger)
		if dr == nil {
			return fmt.Errorf("settles run %q, which was never admitted", r.Run)
		}
		if r.Count < dr.charges {
			return fmt.Errorf("run %q settles %d charges after %d", r.Run, r.Count, dr.charges)
		}
		dr.charges, dr.open = r.Count, false
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

func (b *DatasetBudget) find(run, ledger string) *datasetRun {
	for _, r := range b.runs {
		if r.run == run && r.ledger == ledger {
			return r
		}
	}
	return nil
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

// Admit records that run (with its ledger at ledgerPath) may train on the
// dataset, charging at most maxCharges of step (its step limit: StepLimit),
// if every run's counted charges composed with those stay within the
// lifetime ε; otherwise it records nothing and returns an error wrapping
// ErrDatasetBudget that names the dataset, its budget, what the runs so
// far spent and how many charges of step the budget still allows. A run
// already admitted and not settled is admitted again only if its
// reservation grew. Call it before the run's first release.
func (b *DatasetBudget) Admit(run, ledgerPath string, step accounting.Event, maxCharges int64) (Record, error) {
	if maxCharges < 1 {
		return Record{}, fmt.Errorf("%w: a run must reserve at least one charge, not %d", ErrInvalidParameter, maxCharges)
	}
	if _, err := accounting.PLDStep(step); err != nil {
		return Record{}, fmt.Errorf("the dataset budget composes runs with the PLD accountant: %w", err)
	}
	dr := b.find(run, ledgerPath)
	if dr != nil && !sameEvent(dr.event, step) {
		return Record{}, fmt.Errorf("%w: run %q (ledger %s) was admitted with another mechanism (%s)", ErrRunMismatch, run, ledgerPath, dr.event.Describe())
	}
	if dr != nil && dr.open && dr.reserved >= maxCharges {
		h, _ := b.file.Head() // already admitted for as much
		return h, nil
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
		return Record{}, err
	}
	after, err := b.epsilonWith(&step, maxCharges)
	if err != nil {
		return Record{}, err
	}
	if after > b.budget.TargetEpsilon {
		room, err := b.room(step)
		if err != nil {
			return Record{}, err
		}
		s, _ := accounting.PLDStep(step)
		return Record{}, fmt.Errorf("%w: dataset %s (sha256 %s) has a lifetime budget of ε = %.4g at δ = %g; its runs so far count for ε = %.4g, and run %q may charge up to %d steps (q = %.6g, σ = %.6g), which would take it to ε = %.4g. The budget leaves room for at most %d such steps: lower --max-steps or --target-epsilon, or raise σ",
			ErrDatasetBudget, orDashLabel(b.budget.Label), short(b.budget.Dataset), b.budget.TargetEpsilon, b.budget.Delta, prior, run, maxCharges, s.SampleRate, s.NoiseMultiplier, after, room)
	}
	r, err := b.file.Append(Record{Kind: RecordAdmit, Run: run, Ledger: ledgerPath, Event: &step, Count: maxCharges, Epsilon: after})
	if err != nil {
		return Record{}, err
	}
	if dr != nil {
		saved.reserved, saved.open = maxCharges, true
	} else {
		b.runs = append(b.runs, &datasetRun{run: run, ledger: ledgerPath, event: step, reserved: maxCharges, open: true})
	}
	b.spent = after
	return r, nil
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

// Settle records that run stopped after charges charges, its ledger's head
// hash being head: from now on it counts for those charges instead of its
// reservation. A run not admitted is an error; so is a run settled again
// with fewer charges or more than it reserved.
func (b *DatasetBudget) Settle(run, ledgerPath string, charges int64, head string) (Record, error) {
	dr := b.find(run, ledgerPath)
	switch {
	case dr == nil:
		return Record{}, fmt.Errorf("%w: run %q (ledger %s) was never admitted to dataset %s", ErrInvalidParameter, run, ledgerPath, short(b.budget.Dataset))
	case charges < dr.charges || dr.open && charges > dr.reserved:
		return Record{}, fmt.Errorf("%w: run %q settles %d charges; it had %d and reserved %d", ErrInvalidParameter, run, charges, dr.charges, dr.reserved)
	case !dr.open && charges == dr.charges:
		h, _ := b.file.Head() // nothing new
		return h, nil
	}
	saved := *dr
	dr.charges, dr.open = charges, false
	after, err := b.epsilonWith(nil, 0)
	if err == nil {
		var r Record
		r, err = b.file.Append(Record{Kind: RecordSettle, Run: run, Ledger: ledgerPath, Count: charges, Head: head, Epsilon: after})
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
	Path            string   `json:"path"`
	OK              bool     `json:"ok"`
	Problems        []string `json:"problems"`
	Dataset         string   `json:"dataset"`
	Label           string   `json:"label"`
	LifetimeEpsilon float64  `json:"lifetime_epsilon"`
	Delta           float64  `json:"delta"`
	Records         int      `json:"records"`
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
	Run      string           `json:"run"`
	Ledger   string           `json:"ledger"`
	Event    accounting.Event `json:"event"`
	Reserved int64            `json:"reserved"`
	Charges  int64            `json:"charges"`
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
		rep.Runs = append(rep.Runs, DatasetRunReport{Run: r.run, Ledger: r.ledger, Event: r.event, Reserved: r.reserved, Charges: r.charges, Open: r.open})
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

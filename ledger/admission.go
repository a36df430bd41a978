package ledger

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"regexp"

	"github.com/dpcluster/dpcluster/accounting"
)

// Admission binds a run to the dataset budget that admitted it
// (DatasetBudget.Admit). The run's configuration carries it, so the run
// record of the run's ledger states it (StartRun) on every replica: the
// ledger says which budget counts it, and the budget names the admission,
// which is how a resumed run is told from a new run that reuses a data
// directory or a run name.
type Admission struct {
	// Dataset is the training set's content hash (lower-case hex SHA-256).
	Dataset string `json:"dataset" msgpack:"dataset"`
	// Budget is the budget's ID (DatasetBudget.ID); ID the admission's, a
	// random ID drawn when the run was first admitted.
	Budget string `json:"budget" msgpack:"budget"`
	ID     string `json:"id" msgpack:"id"`
	// File is the budget file's absolute path when the run was first
	// admitted: where to look for the budget, not part of its identity.
	File string `json:"file" msgpack:"file"`
	// Epsilon and Delta are the budget's lifetime ε and δ.
	Epsilon float64 `json:"epsilon" msgpack:"epsilon"`
	Delta   float64 `json:"delta" msgpack:"delta"`
}

var randomID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Validate checks the admission's fields' formats.
func (a Admission) Validate() error {
	switch {
	case !datasetHash.MatchString(a.Dataset):
		return fmt.Errorf("%w: admission: dataset hash %q is not a SHA-256", ErrInvalidParameter, a.Dataset)
	case a.Budget == "" || a.ID == "":
		return fmt.Errorf("%w: admission without a budget or admission ID", ErrInvalidParameter)
	case !(a.Epsilon > 0) || math.IsInf(a.Epsilon, 0) || !(a.Delta > 0 && a.Delta < 1):
		return fmt.Errorf("%w: admission: lifetime ε %v, δ %v", ErrInvalidParameter, a.Epsilon, a.Delta)
	}
	return nil
}

// DatasetAdmission returns the dataset budget admission a run record
// states, and false for a run record of a run admitted to no budget (or a
// record of another kind).
func (r Record) DatasetAdmission() (Admission, bool) {
	if r.Kind != RecordRun || r.AdmissionID == "" {
		return Admission{}, false
	}
	return Admission{Dataset: r.Dataset, Budget: r.BudgetID, ID: r.AdmissionID, File: r.BudgetFile,
		Epsilon: r.BudgetEpsilon, Delta: r.BudgetDelta}, true
}

// admissionName describes an admission in messages.
func admissionName(a Admission, ok bool) string {
	if !ok {
		return "(none)"
	}
	return fmt.Sprintf("%s of budget %s (dataset %s)", short(a.ID), short(a.Budget), short(a.Dataset))
}

func deref(a *Admission) (Admission, bool) {
	if a == nil {
		return Admission{}, false
	}
	return *a, true
}

// newRandomID returns 128 random bits from the OS CSPRNG in hex: a
// budget's or an admission's ID. Two IDs collide with probability about
// n²/2^129 for n IDs.
func newRandomID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("ledger: drawing an ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// RunLedger is a run's ledger as a dataset budget reads it
// (ReadRunLedger): whether it holds a run record, and how far it got.
type RunLedger struct {
	// Path is the ledger file's path.
	Path string
	// Run is the run record; nil when there is no ledger at Path or it
	// holds none (the run never started).
	Run *Record
	// Charges counts its charge records and Event is the first one's
	// event (nil with none); Ended says it holds an end record.
	Charges int64
	Event   *accounting.Event
	Ended   bool
	// Hashes holds every record's hash, in file order: Head is the last,
	// and a ledger extends another exactly when it holds that one's head.
	Hashes []string
	// Torn is the size of a torn tail (not counted: never durable).
	Torn int64
}

// ReadRunLedger reads the run ledger at path without modifying it. A
// missing file is a RunLedger with no run record, not an error; a corrupt
// one is an error wrapping ErrCorrupt.
func ReadRunLedger(path string) (RunLedger, error) {
	rl := RunLedger{Path: path}
	recs, torn, err := ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rl, nil
	case err != nil:
		return rl, err
	}
	rl.Torn = torn
	for i := range recs {
		r := recs[i]
		rl.Hashes = append(rl.Hashes, r.Hash)
		switch r.Kind {
		case RecordRun:
			if rl.Run == nil {
				rl.Run = &recs[i]
			}
		case RecordCharge:
			if rl.Charges == 0 {
				rl.Event = r.Event
			}
			rl.Charges++
		case RecordEnd:
			rl.Ended = true
		}
	}
	return rl, nil
}

// Head returns the hash of the ledger's last record ("" if none).
func (rl RunLedger) Head() string {
	if len(rl.Hashes) == 0 {
		return ""
	}
	return rl.Hashes[len(rl.Hashes)-1]
}

// Holds reports whether the ledger holds a record whose hash is h: the
// hash chain makes every record before it identical to the ledger whose
// head h was.
func (rl RunLedger) Holds(h string) bool {
	for _, x := range rl.Hashes {
		if x == h {
			return true
		}
	}
	return false
}

// History returns the Raft history the ledger's run record binds it to.
func (rl RunLedger) History() string {
	if rl.Run == nil {
		return ""
	}
	return rl.Run.History
}

// ReadRunRecord reads only the first record of the ledger file at path,
// verified as ReadFile verifies it (CRC, format, hash): a run ledger's run
// record, which states the run's dataset budget admission. It is cheap
// whatever the ledger's length, for scanning many ledgers. ok is false for
// a missing or empty file, a torn first record, or a first record of
// another kind; damage is an error wrapping ErrCorrupt.
func ReadRunRecord(path string) (r Record, ok bool, err error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("ledger: %w", err)
	}
	defer fh.Close()
	r, ok, err = readRunRecord(fh)
	if err != nil {
		return Record{}, false, fmt.Errorf("%s: %w", path, err)
	}
	return r, ok, nil
}

// readRunRecord is ReadRunRecord on the file's bytes.
func readRunRecord(fh io.Reader) (r Record, ok bool, err error) {
	// The first frame's length, then that frame alone through scan: its
	// CRC, format, sequence number and hash checked as ReadFile checks
	// them, and nothing after it read.
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(fh, hdr[:]); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return Record{}, false, nil
		}
		return Record{}, false, err
	}
	n := int64(min(binary.LittleEndian.Uint32(hdr[0:4]), maxRecordSize))
	recs, _, err := scan(io.MultiReader(bytes.NewReader(hdr[:]), io.LimitReader(fh, n)))
	if err != nil || len(recs) == 0 {
		return Record{}, false, err
	}
	return recs[0], recs[0].Kind == RecordRun, nil
}

// RebuildDatasetBudget writes in dir a new file for the dataset budget
// that the run ledgers rls were admitted to (their run records' admission:
// one dataset, one budget ID, which the new file keeps, so the runs resume
// under it), and returns its path: for each run an admit record of its
// admission, reserving, for a run whose ledger holds an end record, the
// charges it made, and a settle record of them (history and head); for a
// run that has not ended (running, or crashed), its whole step limit at
// its target ε, not settled. A budget rebuilt this way counts only the
// runs whose ledgers it was given; the ones it was not given (lost, or
// elsewhere) are not counted, so the caller should give it every run's.
// An admission that takes the dataset past its lifetime is recorded all
// the same (it happened): AuditDatasetBudget reports it. It refuses to
// replace an existing budget file, ledgers of several budgets or datasets,
// a ledger without an admission, the same admission twice, and a run that
// has not ended and made no charge (its mechanism is not known yet).
func RebuildDatasetBudget(dir string, rls []RunLedger) (string, error) {
	if len(rls) == 0 {
		return "", fmt.Errorf("%w: no run ledgers to rebuild a dataset budget from", ErrInvalidParameter)
	}
	var first Admission
	seen := map[string]string{}
	for i, rl := range rls {
		if rl.Run == nil {
			return "", fmt.Errorf("%w: %s holds no run record", ErrInvalidParameter, rl.Path)
		}
		a, ok := rl.Run.DatasetAdmission()
		switch {
		case !ok:
			return "", fmt.Errorf("%w: run %q (%s) was admitted to no dataset budget", ErrInvalidParameter, rl.Run.Run, rl.Path)
		case i == 0:
			first = a
		case a.Dataset != first.Dataset || a.Budget != first.Budget || a.Epsilon != first.Epsilon || a.Delta != first.Delta:
			return "", fmt.Errorf("%w: %s was admitted to budget %s of dataset %s (ε = %g, δ = %g), %s to budget %s of dataset %s (ε = %g, δ = %g): rebuild one budget at a time",
				ErrInvalidParameter, rls[0].Path, short(first.Budget), short(first.Dataset), first.Epsilon, first.Delta, rl.Path, short(a.Budget), short(a.Dataset), a.Epsilon, a.Delta)
		}
		if p, dup := seen[a.ID]; dup {
			return "", fmt.Errorf("%w: %s and %s hold the same admission %s (a copy?): give one of them", ErrInvalidParameter, p, rl.Path, short(a.ID))
		}
		seen[a.ID] = rl.Path
		if !rl.Ended && rl.Charges == 0 {
			return "", fmt.Errorf("%w: run %q (%s) has not ended and made no charge, so its reservation is not known: rebuild once it charged or ended", ErrInvalidParameter, rl.Run.Run, rl.Path)
		}
	}
	path, err := createDatasetBudget(dir, Record{Kind: RecordBudget, Dataset: first.Dataset, Label: fmt.Sprintf("rebuilt from %d run ledgers", len(rls)),
		TargetEpsilon: first.Epsilon, Delta: first.Delta, Accountant: AccountantPLD, BudgetID: first.Budget})
	if err != nil {
		return "", err
	}
	b, err := OpenDatasetBudget(path)
	if err != nil {
		return "", err
	}
	defer b.Close()
	for _, rl := range rls {
		if rl.Charges == 0 {
			continue // ended without a charge: counts for nothing
		}
		a, _ := rl.Run.DatasetAdmission()
		reserve := rl.Charges
		if !rl.Ended {
			limit, err := accounting.PLD{}.StepLimit(*rl.Event, rl.Run.TargetEpsilon, rl.Run.Delta, 0)
			if err != nil {
				return "", fmt.Errorf("run %q: %w", rl.Run.Run, err)
			}
			reserve = max(reserve, limit)
		}
		admit := Record{Kind: RecordAdmit, Run: rl.Run.Run, Ledger: rl.Path, AdmissionID: a.ID, Event: rl.Event, Count: reserve}
		if err := b.apply(admit); err != nil {
			return "", fmt.Errorf("run %q: %w", rl.Run.Run, err)
		}
		if admit.Epsilon, err = b.epsilonWith(nil, 0); err != nil {
			return "", err
		}
		if _, err := b.file.Append(admit); err != nil {
			return "", err
		}
		b.spent = admit.Epsilon
		if rl.Ended {
			if _, err := b.settle(b.find(a.ID, "", ""), rl.Charges, rl.Path, rl.History(), rl.Head()); err != nil {
				return "", err
			}
		}
	}
	return path, nil
}

// CheckRuns compares a dataset budget's audit with run ledgers found
// beside it (rls; those of other datasets are ignored) and adds a problem
// to rep for every one it does not count in full: a run of this dataset
// admitted to another budget (a budget created again, or kept elsewhere),
// an admission this budget does not hold, and a run whose ledger holds
// more charges than the budget counts for it, or that does not extend
// what it settled. It returns the number of ledgers of this dataset.
func CheckRuns(rep *DatasetAudit, rls []RunLedger) int {
	id := rep.BudgetID
	n := 0
	bad := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }
	for _, rl := range rls {
		if rl.Run == nil {
			continue
		}
		a, ok := rl.Run.DatasetAdmission()
		if !ok || a.Dataset != rep.Dataset {
			continue
		}
		n++
		if a.Budget != id {
			bad("run %q (%s) trained on this dataset under another budget (%s, lifetime ε = %g, file %s): its %d charges are not counted here",
				rl.Run.Run, rl.Path, short(a.Budget), a.Epsilon, a.File, rl.Charges)
			continue
		}
		var run *DatasetRunReport
		for i := range rep.Runs {
			if rep.Runs[i].Admission == a.ID {
				run = &rep.Runs[i]
			}
		}
		if run == nil {
			bad("run %q (%s) was admitted as %s, which this budget does not hold: its %d charges are not counted", rl.Run.Run, rl.Path, short(a.ID), rl.Charges)
			continue
		}
		counted := run.Charges
		if run.Open {
			counted = run.Reserved
		}
		switch {
		case counted < rl.Charges:
			bad("run %q (%s) holds %d charges; the budget counts it for %d", rl.Run.Run, rl.Path, rl.Charges, counted)
		case !run.Open && run.Head != "" && !rl.Holds(run.Head):
			bad("run %q (%s) does not extend the ledger its admission settled (head %s)", rl.Run.Run, rl.Path, short(run.Head))
		}
	}
	rep.OK = len(rep.Problems) == 0
	return n
}

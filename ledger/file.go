package ledger

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/internal/durable"
	"github.com/dpcluster/dpcluster/seed"
)

// The ledger file is an append-only sequence of framed records:
//
//	[4 bytes little-endian payload length][4 bytes CRC32C of payload][payload]
//
// and each payload is the JSON encoding of a Record. The frame's CRC detects
// torn and corrupted writes; the SHA-256 hash chain inside the payloads
// makes any edit of a committed record, or its removal from the middle,
// detectable by an auditor who holds only the file (after etcd's WAL, which
// frames records with a length and CRC and repairs only torn tails).
//
// Durability contract: Append returns only after the record and every
// record before it have been written and fsynced. A torn tail, left by a
// crash inside Append, is truncated away on Open: that append never
// returned, so the step it would have charged was never applied and will
// be charged again when the Raft log is replayed. Any other damage is
// ErrCorrupt.

// FileFormat is the version of the ledger file format, stored in every
// record.
const FileFormat = 1

// maxRecordSize bounds a record frame; a larger length header is
// corruption, not a reason to allocate.
const maxRecordSize = 1 << 20

const frameHeader = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors returned by the ledger file.
var (
	// ErrCorrupt is returned when a ledger file is damaged anywhere but in
	// a torn final record: a CRC mismatch, a broken hash chain, an unknown
	// format or a malformed record.
	ErrCorrupt = errors.New("ledger: corrupt ledger file")
	// ErrBroken is returned by every Append after a write or fsync failed:
	// the state of the file on disk is unknown, so the ledger fails closed
	// and training must stop.
	ErrBroken = errors.New("ledger: ledger file unusable after a write failure")
	// ErrClosed is returned by operations on a closed ledger file.
	ErrClosed = errors.New("ledger: ledger file closed")
)

// RecordKind tells what a ledger record states.
type RecordKind string

const (
	// RecordRun opens a run: its privacy parameters and budget. Charges
	// that follow are accounted against it.
	RecordRun RecordKind = "run"
	// RecordCharge charges one noisy release.
	RecordCharge RecordKind = "charge"
	// RecordEnd states that the run ended: why (Reason) and the last
	// step applied (Step), at the Raft position of the entry that ended
	// it. At most one, after the run record; only replay charges may
	// follow it (Ledger.End). Ledgers written before it have none.
	RecordEnd RecordKind = "end"
	// RecordBudget, RecordAdmit and RecordSettle are the records of a
	// dataset budget file (DatasetBudget), never of a run's ledger.
	RecordBudget RecordKind = "budget"
	RecordAdmit  RecordKind = "admit"
	RecordSettle RecordKind = "settle"
)

// Record is one ledger entry. Only privatized quantities and public
// constants appear here, never per-node sums or counts.
type Record struct {
	Format int        `json:"format"`
	Seq    uint64     `json:"seq"` // 1-based position in the file
	Kind   RecordKind `json:"kind"`
	// Run records: the run's identity and budget.
	Run           string  `json:"run,omitempty"`
	TargetEpsilon float64 `json:"target_epsilon,omitempty"`
	Delta         float64 `json:"delta,omitempty"`
	// Noise says where the run's noise came from: seed.Crypto, or
	// seed.Seeded for a reproducible run that is NOT differentially
	// private. Empty in ledgers written before the field existed.
	Noise seed.Policy `json:"noise,omitempty"`
	// Mechanism names how the leader drew the noise: MechanismDiscrete or
	// MechanismFloat. Empty in ledgers written before the field existed,
	// whose runs all used the floating-point sampler.
	Mechanism string `json:"mechanism,omitempty"`
	// Accountant names the accountant the run's budget is enforced with
	// and its charges' Epsilon computed by: AccountantPLD or AccountantRDP.
	// Empty in ledgers written before the field existed, whose runs all
	// used RDP; omitted when empty, so their records hash as before.
	Accountant string `json:"accountant,omitempty"`
	// History identifies the Raft history (a random ID chosen when the run
	// configuration is first proposed, see Position): in the run record,
	// the one history the ledger is bound to; in a charge record, the
	// history the charged entry belongs to, always the run record's.
	// Empty in ledgers written before the field existed (and then in all
	// their records: such a ledger is bound to the configuration entries
	// that carry no history ID either).
	History string `json:"history,omitempty"`
	// Charge records: which training step released, the mechanism that
	// released it, and where the release sits in the Raft log.
	Step  int64             `json:"step,omitempty"`
	Event *accounting.Event `json:"event,omitempty"`
	Term  uint64            `json:"term,omitempty"`
	Index uint64            `json:"index,omitempty"`
	// Replay marks a charge for a step that had already been applied: the
	// release happened (it was committed), so it is charged, but the
	// update was not applied again. A step may also be charged twice
	// without Replay (AuditReport.Recharges): charged ahead of its g̃ by a
	// leader that died before the g̃ was committed, then again by the next
	// leader.
	Replay bool `json:"replay,omitempty"`
	// Reason is why the run ended (end records only): the state
	// machine's stop reason, e.g. "max steps reached" or "privacy budget
	// exhausted". Empty in every other record, so theirs hash as before.
	Reason string `json:"reason,omitempty"`
	// Epsilon is ε spent so far, at the run's δ, by the run record's
	// accountant (RDP over DefaultOrders, or PLD: see pldBudget.epsilon),
	// including this record.
	Epsilon float64 `json:"epsilon,omitempty"`
	// Dataset budget records (DatasetBudget): Dataset is the training
	// set's content hash and Label what its owner calls it (budget
	// record); Ledger is the path of an admitted run's ledger, which with
	// Run names the run, Count the charges reserved for it (admit) or
	// made by it (settle), and Head its ledger's head hash at settling.
	// Empty in run ledgers, so their records hash as before.
	Dataset string `json:"dataset,omitempty"`
	Label   string `json:"label,omitempty"`
	Ledger  string `json:"ledger,omitempty"`
	Count   int64  `json:"count,omitempty"`
	Head    string `json:"head,omitempty"`
	// A dataset budget's identity and its runs' (Admission): BudgetID is
	// the budget's random ID, drawn when it is created (budget record;
	// absent in budgets from before the field, whose ID is then their
	// budget record's hash); AdmissionID is the random ID of one run's
	// admission (admit and settle records). A run record of a run
	// admitted to a dataset budget states that admission: Dataset,
	// BudgetID, AdmissionID, BudgetFile (the budget file's path when the
	// run was first admitted), and the budget's lifetime BudgetEpsilon
	// and BudgetDelta, so the budget can be found, checked and rebuilt
	// from its runs' ledgers. All empty otherwise, so records without
	// them hash as before.
	BudgetID      string  `json:"budget_id,omitempty"`
	AdmissionID   string  `json:"admission_id,omitempty"`
	BudgetFile    string  `json:"budget_file,omitempty"`
	BudgetEpsilon float64 `json:"budget_epsilon,omitempty"`
	BudgetDelta   float64 `json:"budget_delta,omitempty"`
	// PrevHash chains this record to the one before it (hex SHA-256; all
	// zeros for the first record). Hash is SHA-256 over the record's JSON
	// encoding with Hash empty.
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
}

// genesisHash is PrevHash of the first record.
var genesisHash = hex.EncodeToString(make([]byte, sha256.Size))

// computeHash returns the hash of r: SHA-256 over its JSON encoding with the
// Hash field empty. PrevHash is inside the hashed bytes, which chains it.
func computeHash(r Record) (string, []byte, error) {
	r.Hash = ""
	b, err := json.Marshal(r)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), b, nil
}

// File is an open ledger file. It is safe for concurrent use, though the
// coordinator appends from its state machine only.
type File struct {
	mu     sync.Mutex
	f      *os.File
	path   string
	size   int64 // bytes of complete records
	head   Record
	n      uint64
	broken error
	closed bool

	// held says Append defers its fsync to Flush (Hold); durable is the
	// file's state at its last successful fsync, what a failed write or
	// sync cuts it back to.
	held    bool
	durable fileMark

	// sync is f.Sync; tests replace it to inject failures.
	sync func() error
}

// fileMark is a File's length, record count and last record.
type fileMark struct {
	size int64
	n    uint64
	head Record
}

func (f *File) mark() fileMark { return fileMark{size: f.size, n: f.n, head: f.head} }

// OpenFile opens the ledger file at path, creating it (and fsyncing its
// directory) if it does not exist. It verifies every record's CRC and the
// hash chain, and truncates a torn final record (a frame cut short by a
// crash), fsyncing the repair. It returns ErrCorrupt for any other damage.
// The repaired count is the number of bytes removed from the tail.
func OpenFile(path string, opts ...Option) (f *File, repaired int64, err error) {
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: open %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			fh.Close()
		}
	}()
	if err := durable.SyncDir(filepath.Dir(path)); err != nil {
		return nil, 0, fmt.Errorf("ledger: %w", err)
	}
	st, err := fh.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: stat %s: %w", path, err)
	}
	recs, good, err := scan(fh)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	if good < st.Size() {
		repaired = st.Size() - good
		if err := fh.Truncate(good); err != nil {
			return nil, 0, fmt.Errorf("ledger: repairing torn tail of %s: %w", path, err)
		}
		if err := fh.Sync(); err != nil {
			return nil, 0, fmt.Errorf("ledger: repairing torn tail of %s: %w", path, err)
		}
	}
	if _, err := fh.Seek(good, io.SeekStart); err != nil {
		return nil, 0, err
	}
	lf := &File{f: fh, path: path, size: good, n: uint64(len(recs))}
	lf.sync = fh.Sync
	for _, o := range opts {
		o(lf)
	}
	if len(recs) > 0 {
		lf.head = recs[len(recs)-1]
	}
	lf.durable = lf.mark()
	return lf, repaired, nil
}

// Option configures OpenFile and Open.
type Option func(*File)

// WithSyncHook makes the file call fn, instead of fsync, where it would
// fsync an appended record. It exists to inject write failures in tests
// (a full disk, an fsync error); fn may call f.Sync itself.
func WithSyncHook(fn func(f *os.File) error) Option {
	return func(lf *File) {
		fh := lf.f
		lf.sync = func() error { return fn(fh) }
	}
}

// ReadFile reads and verifies every record of the ledger file at path
// without modifying it. A torn tail is reported as torn (its byte count),
// not as an error; any other damage is ErrCorrupt, with the offset.
func ReadFile(path string) (recs []Record, torn int64, err error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, 0, err
	}
	recs, good, err := scan(fh)
	if err != nil {
		return recs, 0, fmt.Errorf("%s: %w", path, err)
	}
	return recs, st.Size() - good, nil
}

// scan reads records from r until EOF. It returns the verified records and
// the offset just past the last complete one. A final frame cut short by
// EOF (header or payload) is a torn tail and ends the scan without error.
// A CRC mismatch, a malformed or out-of-order record, or a broken hash chain
// is ErrCorrupt.
func scan(r io.Reader) ([]Record, int64, error) { return scanFrom(r, 0, genesisHash) }

// scanFrom is scan for frames that follow the first `after` records, the
// last of which has hash prev: the first frame read must be record
// after+1 and link to prev.
func scanFrom(r io.Reader, after uint64, prev string) ([]Record, int64, error) {
	br := bufio.NewReader(r)
	var (
		recs []Record
		off  int64
		hdr  [frameHeader]byte
	)
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return recs, off, nil // clean end, or torn header
			}
			return recs, off, err
		}
		n := binary.LittleEndian.Uint32(hdr[0:4])
		sum := binary.LittleEndian.Uint32(hdr[4:8])
		if n == 0 && sum == 0 {
			// A zero-filled tail (preallocated blocks a crash left
			// behind) is torn only if nothing but zeros follows.
			rest, err := io.ReadAll(br)
			if err != nil {
				return recs, off, err
			}
			if bytes.Count(rest, []byte{0}) == len(rest) {
				return recs, off, nil
			}
			return recs, off, fmt.Errorf("%w: empty frame at offset %d followed by data", ErrCorrupt, off)
		}
		if n > maxRecordSize {
			return recs, off, fmt.Errorf("%w: record at offset %d claims %d bytes", ErrCorrupt, off, n)
		}
		payload := make([]byte, n)
		if m, err := io.ReadFull(br, payload); err != nil {
			if err != io.EOF && err != io.ErrUnexpectedEOF {
				return recs, off, err
			}
			// A crash leaves a prefix of the last frame, perhaps
			// followed by zeros. A JSON payload never holds a NUL byte
			// and every frame header does (its length is below 1<<24),
			// so a NUL followed by data means whole frames follow: the
			// length is corrupt, and truncating would drop records.
			rest := payload[:m]
			if i := bytes.IndexByte(rest, 0); i >= 0 && bytes.Count(rest[i:], []byte{0}) != len(rest)-i {
				return recs, off, fmt.Errorf("%w: record at offset %d claims %d bytes, past the end of the file, with records after it", ErrCorrupt, off, n)
			}
			return recs, off, nil // torn payload
		}
		if crc32.Checksum(payload, castagnoli) != sum {
			return recs, off, fmt.Errorf("%w: CRC mismatch in record %d at offset %d", ErrCorrupt, after+uint64(len(recs))+1, off)
		}
		rec, err := verifyRecord(payload, after+uint64(len(recs))+1, prev)
		if err != nil {
			return recs, off, fmt.Errorf("%w at offset %d", err, off)
		}
		recs = append(recs, rec)
		prev = rec.Hash
		off += frameHeader + int64(n)
	}
}

// openAndReplay opens the file at path (OpenFile, repairing a torn tail)
// and hands its verified records to replay; the file is closed if either
// fails. Run ledgers (Open) and dataset budgets (OpenDatasetBudget) open
// this way.
func openAndReplay(path string, opts []Option, replay func([]Record) error) (*File, error) {
	f, _, err := OpenFile(path, opts...)
	if err != nil {
		return nil, err
	}
	recs, _, err := ReadFile(path)
	if err == nil {
		err = replay(recs)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// verifyRecord decodes a payload and checks its format, sequence number,
// chain link and hash.
func verifyRecord(payload []byte, seq uint64, prev string) (Record, error) {
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return rec, fmt.Errorf("%w: record %d does not decode: %v", ErrCorrupt, seq, err)
	}
	switch {
	case rec.Format != FileFormat:
		return rec, fmt.Errorf("%w: record %d has format %d (this build reads %d)", ErrCorrupt, seq, rec.Format, FileFormat)
	case rec.Seq != seq:
		return rec, fmt.Errorf("%w: record %d carries sequence number %d", ErrCorrupt, seq, rec.Seq)
	case rec.PrevHash != prev:
		return rec, fmt.Errorf("%w: record %d breaks the hash chain", ErrCorrupt, seq)
	}
	want, _, err := computeHash(rec)
	if err != nil {
		return rec, err
	}
	if rec.Hash != want {
		return rec, fmt.Errorf("%w: record %d hash mismatch", ErrCorrupt, seq)
	}
	switch rec.Kind {
	case RecordRun, RecordBudget, RecordSettle:
	case RecordCharge, RecordAdmit:
		if rec.Event == nil {
			return rec, fmt.Errorf("%w: %s record %d has no event", ErrCorrupt, rec.Kind, seq)
		}
		if err := rec.Event.Validate(); err != nil {
			return rec, fmt.Errorf("%w: record %d: %v", ErrCorrupt, seq, err)
		}
	case RecordEnd:
		if err := checkEnd(rec); err != nil {
			return rec, fmt.Errorf("%w: record %d: %v", ErrCorrupt, seq, err)
		}
	default:
		return rec, fmt.Errorf("%w: record %d has unknown kind %q", ErrCorrupt, seq, rec.Kind)
	}
	return rec, nil
}

// Append fills in r's format, sequence number and hash chain, writes it and
// fsyncs the file (while held, Flush does; see Hold), and returns the
// record as written. On any write or sync failure it tries to cut the file
// back to its last durable record, marks the File broken and returns an
// error wrapping ErrBroken (and the cause); every later Append fails the
// same way. The caller must then stop: a charge that cannot be made
// durable must not be followed by a release.
func (f *File) Append(r Record) (Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		return Record{}, ErrClosed
	case f.broken != nil:
		return Record{}, f.broken
	}
	if err := validateNew(r); err != nil {
		return Record{}, err
	}
	r.Format = FileFormat
	r.Seq = f.n + 1
	r.PrevHash = f.headHash()
	h, _, err := computeHash(r)
	if err != nil {
		return Record{}, err
	}
	r.Hash = h
	payload, err := json.Marshal(r)
	if err != nil {
		return Record{}, err
	}
	frame := make([]byte, frameHeader+len(payload))
	putFrameHeader(frame, payload)
	copy(frame[frameHeader:], payload)
	if _, err := f.f.Write(frame); err != nil {
		return Record{}, f.fail(err)
	}
	f.size += int64(len(frame))
	f.n++
	f.head = r
	if !f.held {
		if err := f.syncLocked(); err != nil {
			return Record{}, err
		}
	}
	return r, nil
}

// Hold makes Append write without fsyncing until Flush, so that a batch of
// records costs one fsync. Size, and a snapshot's copy, still cover only
// the records already fsynced. The caller must Flush before anything that
// depends on the held records (a release after a charge) leaves it.
func (f *File) Hold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = true
}

// Flush ends Hold: it fsyncs the records appended since the last fsync, if
// any. A failed fsync cuts the file back to its last durable record and
// breaks it, as in Append: none of the held records can be trusted.
func (f *File) Flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = false
	switch {
	case f.closed:
		return ErrClosed
	case f.broken != nil:
		return f.broken
	case f.size == f.durable.size:
		return nil
	}
	return f.syncLocked()
}

// syncLocked fsyncs the file and marks what it wrote durable; on failure
// it breaks the file. Called with f.mu held.
func (f *File) syncLocked() error {
	if err := f.sync(); err != nil {
		return f.fail(err)
	}
	f.durable = f.mark()
	return nil
}

// appendFrames appends frames, whole ledger frames that continue this
// file (its next record first, linked to its head), with one write and one
// fsync. Each record is verified as OpenFile verifies a file's (CRC,
// sequence number, chain link, hash, kind); a torn or trailing partial
// frame is refused. check, if not nil, sees the verified records before
// anything is written and may refuse them. A refusal leaves the file as
// it was; a write or sync failure breaks it, as in Append.
func (f *File) appendFrames(frames []byte, check func([]Record) error) ([]Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		return nil, ErrClosed
	case f.broken != nil:
		return nil, f.broken
	}
	recs, good, err := scanFrom(bytes.NewReader(frames), f.n, f.headHash())
	if err != nil {
		return nil, err
	}
	if good != int64(len(frames)) {
		return nil, fmt.Errorf("%w: %d bytes after the last whole record of the tail to append", ErrCorrupt, int64(len(frames))-good)
	}
	if len(recs) == 0 {
		return nil, nil
	}
	if check != nil {
		if err := check(recs); err != nil {
			return nil, err
		}
	}
	if _, err := f.f.Write(frames); err != nil {
		return nil, f.fail(err)
	}
	f.size += int64(len(frames))
	f.n += uint64(len(recs))
	f.head = recs[len(recs)-1]
	if err := f.syncLocked(); err != nil {
		return nil, err
	}
	return recs, nil
}

func validateNew(r Record) error {
	switch r.Kind {
	case RecordRun, RecordBudget, RecordSettle:
		return nil
	case RecordCharge, RecordAdmit:
		if r.Event == nil {
			return fmt.Errorf("%w: %s without an event", accounting.ErrInvalidEvent, r.Kind)
		}
		return r.Event.Validate()
	case RecordEnd:
		if err := checkEnd(r); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidParameter, err)
		}
		return nil
	}
	return fmt.Errorf("ledger: unknown record kind %q", r.Kind)
}

// checkEnd returns why r is not a well-formed end record: it needs a
// reason, a step ≥ 0 and the Raft index (≥ 1) of the entry that ended the
// run, and carries no event, no ε and no replay mark.
func checkEnd(r Record) error {
	switch {
	case r.Reason == "":
		return errors.New("end record without a reason")
	case r.Step < 0:
		return fmt.Errorf("end record with step %d", r.Step)
	case r.Index == 0:
		return errors.New("end record without a Raft index")
	case r.Event != nil || r.Epsilon != 0 || r.Replay:
		return errors.New("end record with a charge's fields")
	}
	return nil
}

// putFrameHeader writes the length and CRC32C of payload into hdr[:8].
func putFrameHeader(hdr, payload []byte) {
	binary.LittleEndian.PutUint32(hdr[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(hdr[4:8], crc32.Checksum(payload, castagnoli))
}

// fail marks the file broken after a write or sync error. It tries to
// truncate the file back to its last durable record, so that the file on
// disk stays a valid prefix, but the File stays broken either way: after a
// failed fsync the kernel may have dropped dirty pages, so nothing written
// since the last successful sync can be trusted.
func (f *File) fail(cause error) error {
	f.size, f.n, f.head = f.durable.size, f.durable.n, f.durable.head
	_ = f.f.Truncate(f.size)
	_, _ = f.f.Seek(f.size, io.SeekStart)
	f.broken = fmt.Errorf("%w: %w", ErrBroken, cause)
	return f.broken
}

func (f *File) headHash() string {
	if f.n == 0 {
		return genesisHash
	}
	return f.head.Hash
}

// Head returns the last record and the number of records. With no records,
// it returns the zero Record and 0.
func (f *File) Head() (Record, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.head, f.n
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Close closes the file, fsyncing first any records still held (Hold).
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	var err error
	if f.broken == nil && f.size != f.durable.size {
		err = f.syncLocked() // records still held
	}
	return errors.Join(err, f.f.Close())
}

// Size returns the number of bytes of complete, durable records. The file
// is append-only, so its first Size bytes never change afterwards: a
// snapshot can record Size and copy that prefix later.
func (f *File) Size() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.durable.size
}

// Install atomically replaces the ledger file at path with data, a ledger
// prefix taken from another replica's snapshot. data must verify (CRCs,
// hash chain, no torn tail); it is written to a temporary file, fsynced,
// renamed over path, and the directory is fsynced (the crash-safe sequence
// of hashicorp/raft's file snapshots).
func Install(path string, data []byte) error {
	if _, good, err := scan(bytes.NewReader(data)); err != nil {
		return fmt.Errorf("ledger: refusing to install: %w", err)
	} else if good != int64(len(data)) {
		return fmt.Errorf("%w: ledger to install has a torn tail", ErrCorrupt)
	}
	err := durable.Replace(path, 0o644, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("ledger: install: %w", err)
	}
	return nil
}

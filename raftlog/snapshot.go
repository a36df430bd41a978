package raftlog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/crc64"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/internal/durable"
)

// SnapshotStore is a replica's Raft snapshots (hashicorp/raft's
// SnapshotStore) as files under DataDir/snapshots, laid out as
// raft.FileSnapshotStore lays them out, so that tools reading that layout
// (coordinator's export) read both:
//
//   - <term>-<index>-<unix ms>/state.bin: what the state machine's
//     snapshot wrote;
//   - <term>-<index>-<unix ms>/meta.json: raft.SnapshotMeta's fields and
//     the state's checksum.
//
// A snapshot is written under the name with ".tmp" appended, then
// state.bin and meta.json are fsynced, the directory renamed into place
// and the parent fsynced: a crash leaves a complete snapshot or a .tmp
// directory that List ignores (and the next OpenSnapshots removes).
// The newest retain snapshots are kept.
//
// The difference from raft.FileSnapshotStore is the checksum: CRC32C
// (meta.json's CRC32C field), which the CPU computes in hardware, instead of
// a table-driven CRC64 (ECMA), which cost 5% of all CPU time in a
// 20M-parameter bench/step profile (docs/BENCHMARKS.md, issue 25) and is
// computed again over the whole file when a snapshot is opened. Open
// checks a snapshot that raft.FileSnapshotStore wrote (a CRC field of 8
// bytes, no CRC32C) with CRC64, so a data dir written before this store
// opens as it was; the reverse does not hold (raft.FileSnapshotStore finds
// no CRC64 in a snapshot written here and refuses it: an older binary
// fails at start on such a data dir, loudly).
type SnapshotStore struct {
	dir      string
	retain   int
	readOnly bool // ReadSnapshots: List and Open only
}

// snapshotsDir, stateFile, metaFile and tmpSuffix are the names of
// raft.FileSnapshotStore's layout.
const (
	snapshotsDir = "snapshots"
	stateFile    = "state.bin"
	metaFile     = "meta.json"
	tmpSuffix    = ".tmp"
)

// snapshotMeta is meta.json: raft.FileSnapshotStore's fields (CRC is its
// CRC64, absent here) and CRC32C.
type snapshotMeta struct {
	raft.SnapshotMeta
	CRC    []byte  `json:",omitempty"`
	CRC32C *uint32 `json:",omitempty"`
}

// ErrSnapshotCorrupt is returned (wrapped) by SnapshotStore.Open for a
// snapshot whose state does not match its checksum, or that has none.
var ErrSnapshotCorrupt = errors.New("raftlog: corrupt snapshot")

// OpenSnapshots returns the snapshot store under base/snapshots, creating
// the directory if needed, keeping the newest retain ≥ 1 snapshots.
func OpenSnapshots(base string, retain int) (*SnapshotStore, error) {
	if retain < 1 {
		return nil, fmt.Errorf("raftlog: retain %d snapshots: must be at least 1", retain)
	}
	dir := filepath.Join(base, snapshotsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftlog: snapshots: %w", err)
	}
	// Unfinished snapshots of an earlier process: no sink writes them.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("raftlog: snapshots: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() && strings.HasSuffix(e.Name(), tmpSuffix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("raftlog: removing an unfinished snapshot: %w", err)
			}
		}
	}
	return &SnapshotStore{dir: dir, retain: retain}, nil
}

// ReadSnapshots returns the snapshot store under base/snapshots for
// reading only, every snapshot listed (no retain bound), without creating
// or removing anything: a running replica may own the directory (coordinator
// export reads it beside one). It returns nil and no error when there is
// no snapshot directory. Create on it fails.
func ReadSnapshots(base string) (*SnapshotStore, error) {
	dir := filepath.Join(base, snapshotsDir)
	if st, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("raftlog: snapshots: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("raftlog: snapshots: %s is not a directory", dir)
	}
	return &SnapshotStore{dir: dir, retain: math.MaxInt, readOnly: true}, nil
}

// Create starts snapshot version 1 (the only one hashicorp/raft writes)
// of the state at index and term. The state machine writes it to the
// returned sink, then closes it (it becomes visible and durable) or
// cancels it (nothing remains).
func (s *SnapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, _ raft.Transport) (raft.SnapshotSink, error) {
	if s.readOnly {
		return nil, errors.New("raftlog: a snapshot store opened with ReadSnapshots is read-only")
	}
	if version != 1 {
		return nil, fmt.Errorf("raftlog: unsupported snapshot version %d", version)
	}
	id := fmt.Sprintf("%d-%d-%d", term, index, time.Now().UnixMilli())
	tmp := filepath.Join(s.dir, id+tmpSuffix)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("raftlog: snapshot %s: %w", id, err)
	}
	f, err := os.Create(filepath.Join(tmp, stateFile))
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("raftlog: snapshot %s: %w", id, err)
	}
	return &snapshotSink{store: s, tmp: tmp, f: f, w: bufio.NewWriterSize(f, 1<<20), meta: snapshotMeta{
		SnapshotMeta: raft.SnapshotMeta{Version: version, ID: id, Index: index, Term: term,
			Configuration: configuration, ConfigurationIndex: configurationIndex},
	}}, nil
}

// List returns the newest retain snapshots, newest first (by term, then
// index, then ID, as raft.FileSnapshotStore orders them). Directories
// that are not complete snapshots of a version this build reads are
// skipped.
func (s *SnapshotStore) List() ([]*raft.SnapshotMeta, error) {
	all, err := s.all()
	if err != nil {
		return nil, err
	}
	out := make([]*raft.SnapshotMeta, 0, min(len(all), s.retain))
	for _, m := range all[:min(len(all), s.retain)] {
		out = append(out, &m.SnapshotMeta)
	}
	return out, nil
}

// all returns every complete snapshot's meta, newest first.
func (s *SnapshotStore) all() ([]*snapshotMeta, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("raftlog: listing snapshots: %w", err)
	}
	var metas []*snapshotMeta
	for _, e := range ents {
		if !e.IsDir() || strings.HasSuffix(e.Name(), tmpSuffix) {
			continue
		}
		m, err := s.readMeta(e.Name())
		if err != nil || m.ID != e.Name() || m.Version < raft.SnapshotVersionMin || m.Version > raft.SnapshotVersionMax {
			continue
		}
		metas = append(metas, m)
	}
	slices.SortFunc(metas, func(a, b *snapshotMeta) int {
		if a.Term != b.Term {
			return cmpDesc(a.Term, b.Term)
		}
		if a.Index != b.Index {
			return cmpDesc(a.Index, b.Index)
		}
		return strings.Compare(b.ID, a.ID)
	})
	return metas, nil
}

// cmpDesc orders a before b when a is larger.
func cmpDesc(a, b uint64) int {
	if a > b {
		return -1
	}
	return 1
}

func (s *SnapshotStore) readMeta(id string) (*snapshotMeta, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, id, metaFile))
	if err != nil {
		return nil, err
	}
	var m snapshotMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrSnapshotCorrupt, metaFile, err)
	}
	return &m, nil
}

// Open returns snapshot id's meta and its state, after checking the whole
// state against its checksum (CRC32C, or CRC64 for a snapshot written by
// raft.FileSnapshotStore): a damaged snapshot is an error wrapping
// ErrSnapshotCorrupt, never a restore.
func (s *SnapshotStore) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	if id == "" || id != filepath.Base(id) || strings.HasSuffix(id, tmpSuffix) || id == "." || id == ".." {
		return nil, nil, fmt.Errorf("raftlog: snapshot ID %q", id)
	}
	m, err := s.readMeta(id)
	if err != nil {
		return nil, nil, fmt.Errorf("raftlog: snapshot %s: %w", id, err)
	}
	f, err := os.Open(filepath.Join(s.dir, id, stateFile))
	if err != nil {
		return nil, nil, fmt.Errorf("raftlog: snapshot %s: %w", id, err)
	}
	if err := checkState(f, m); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("raftlog: snapshot %s: %w", id, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("raftlog: snapshot %s: %w", id, err)
	}
	return &m.SnapshotMeta, &stateReader{Reader: bufio.NewReaderSize(f, 1<<20), f: f}, nil
}

// crc64Table is raft.FileSnapshotStore's checksum.
var crc64Table = crc64.MakeTable(crc64.ECMA)

// checkState reads f to its end and compares it with m's checksum and
// size.
func checkState(f *os.File, m *snapshotMeta) error {
	var n int64
	var err error
	switch {
	case m.CRC32C != nil:
		h := crc32.New(castagnoli)
		if n, err = io.Copy(h, f); err == nil && h.Sum32() != *m.CRC32C {
			err = fmt.Errorf("%w: CRC32C %08x, meta.json says %08x", ErrSnapshotCorrupt, h.Sum32(), *m.CRC32C)
		}
	case len(m.CRC) == crc64.Size:
		h := crc64.New(crc64Table)
		if n, err = io.Copy(h, f); err == nil && string(h.Sum(nil)) != string(m.CRC) {
			err = fmt.Errorf("%w: CRC64 %x, meta.json says %x", ErrSnapshotCorrupt, h.Sum(nil), m.CRC)
		}
	default:
		return fmt.Errorf("%w: meta.json has no checksum", ErrSnapshotCorrupt)
	}
	if err == nil && n != m.Size {
		err = fmt.Errorf("%w: %d bytes, meta.json says %d", ErrSnapshotCorrupt, n, m.Size)
	}
	return err
}

// stateReader is an open snapshot's state, buffered.
type stateReader struct {
	*bufio.Reader
	f *os.File
}

func (r *stateReader) Close() error { return r.f.Close() }

// reap removes the snapshots beyond the newest retain.
func (s *SnapshotStore) reap() error {
	all, err := s.all()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range all[min(len(all), s.retain):] {
		errs = append(errs, os.RemoveAll(filepath.Join(s.dir, m.ID)))
	}
	return errors.Join(errs...)
}

// snapshotSink is a snapshot being written (SnapshotStore.Create).
type snapshotSink struct {
	store  *SnapshotStore
	tmp    string // the .tmp directory
	f      *os.File
	w      *bufio.Writer
	crc    uint32
	size   int64
	meta   snapshotMeta
	closed bool
}

func (k *snapshotSink) ID() string { return k.meta.ID }

// Write appends b to the state.
func (k *snapshotSink) Write(b []byte) (int, error) {
	k.crc = crc32.Update(k.crc, castagnoli, b)
	n, err := k.w.Write(b)
	k.size += int64(n)
	return n, err
}

// Close makes the snapshot durable and visible: the state and meta.json
// fsynced, the directory renamed into place and its parent fsynced, then
// the snapshots beyond the newest retain removed. On a failure before the
// rename, nothing of the snapshot remains.
func (k *snapshotSink) Close() error {
	if k.closed {
		return nil
	}
	k.closed = true
	if err := k.finish(); err != nil {
		os.RemoveAll(k.tmp)
		return fmt.Errorf("raftlog: snapshot %s: %w", k.meta.ID, err)
	}
	final := strings.TrimSuffix(k.tmp, tmpSuffix)
	if err := os.Rename(k.tmp, final); err != nil {
		os.RemoveAll(k.tmp)
		return fmt.Errorf("raftlog: snapshot %s: %w", k.meta.ID, err)
	}
	if err := durable.SyncDir(k.store.dir); err != nil {
		return fmt.Errorf("raftlog: snapshot %s: %w", k.meta.ID, err)
	}
	return k.store.reap()
}

// finish writes out and fsyncs the state, then meta.json.
func (k *snapshotSink) finish() error {
	err := k.w.Flush()
	if err == nil {
		err = k.f.Sync()
	}
	if cerr := k.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	crc := k.crc
	k.meta.Size, k.meta.CRC32C = k.size, &crc
	b, err := json.Marshal(&k.meta)
	if err != nil {
		return err
	}
	return durable.Replace(filepath.Join(k.tmp, metaFile), 0o644, func(f *os.File) error {
		_, err := f.Write(append(b, '\n'))
		return err
	})
}

// Cancel abandons the snapshot: nothing of it remains.
func (k *snapshotSink) Cancel() error {
	if k.closed {
		return nil
	}
	k.closed = true
	k.f.Close()
	return os.RemoveAll(k.tmp)
}

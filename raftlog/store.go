package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/internal/durable"
)

// Store is the replica's durable Raft log and stable store, in the
// directory DataDir/raft:
//
//   - wal/<first index>.seg: the log, in segment files of about
//     segmentBytes, each a run of consecutive entries. An append writes
//     the entries at the end of the newest segment and fsyncs it once, so
//     an entry's bytes are written once: a step entry carries g̃, a
//     model-sized vector, and this append is a link of every step's serial
//     chain (docs/BENCHMARKS.md, issue 15).
//   - stable: Raft's few stable keys (current term, last vote) and the
//     log's head (the first index not deleted), replaced atomically
//     (temporary file, fsync, rename, fsync of the directory).
//   - LOCK: held (flock) while the store is open for writing, so that two
//     processes never append to one log.
//
// Each entry is a header (index, term, append time, type, data and
// extensions lengths) with its own CRC32C, the data, the extensions, and a
// CRC32C of those chained from the header's, so a damaged entry is
// reported (ErrCorrupt), never applied. Opening the store reads every
// header; an entry is checksummed in full when it is read. Only the end of
// the newest segment may be incomplete after a crash (an append not yet
// fsynced, so never acknowledged to Raft); opening cuts it off. A damaged
// header anywhere else is an error, not a reason to drop entries Raft may
// have acknowledged.
//
// Raft deletes only a head (compaction after a snapshot; the head key is
// written before any file is removed) or a tail (a conflicting suffix:
// the segments after it are removed newest first, then its segment is cut,
// so a crash in between leaves a prefix of the old log, as if the deletion
// had not started). The log is contiguous (it implements
// raft.MonotonicLogStore).
//
// It replaces a bbolt file (raft/log.db, migrated on open by migrateBolt),
// which copied each entry into its pages and wrote it twice, and before
// that raft-wal v0.4.0, whose log could not be reopened after Raft
// truncated its tail (hashicorp/raft-wal#31; docs/RELIABILITY.md).
type Store struct {
	dir      string
	readOnly bool
	lock     *os.File

	// wmu serializes the changes (StoreLogs, DeleteRange, Set): Raft makes
	// them from one goroutine at a time, but the store does not rely on it.
	wmu sync.Mutex
	// segBytes is this store's segment size (SetSegmentBytes; 0:
	// segmentBytes). Under wmu.
	segBytes int64

	// mu guards the fields below. GetLog holds it shared while it reads a
	// file, so a segment is closed only when no read can be using it; an
	// append holds it only to publish entries it has made durable.
	mu     sync.RWMutex
	segs   []*segment // oldest first; entries are appended to the last
	first  uint64     // index of pos[0]; 0 when the log is empty
	pos    []recordPos
	stable map[string][]byte
}

// segment is one file of the log.
type segment struct {
	first uint64 // index of its first entry, its file name
	f     *os.File
	size  int64 // bytes of whole entries
}

// recordPos locates one entry.
type recordPos struct {
	seg     *segment
	off     int64
	dataLen uint32
	extLen  uint32
}

func (p recordPos) size() int64 { return recHeader + int64(p.dataLen) + int64(p.extLen) + 4 }

const (
	// recHeader is index, term, append time (Unix ns), data and
	// extensions lengths (8+8+8+4+4), the type byte and the header's
	// CRC32C (4).
	recHeader = 37
	// maxRecord bounds an entry's declared size, so that a damaged length
	// cannot make a read allocate without limit.
	maxRecord = 1 << 31

	walDir      = "wal"
	segSuffix   = ".seg"
	stableFile  = "stable"
	lockFile    = "LOCK"
	stableMagic = "DPCSTBL1"
	// headKey is the stable key of the log's head. Raft's keys
	// (CurrentTerm, LastVoteTerm, LastVoteCand) never collide with it.
	headKey = "dpcluster/log-head"
)

// segmentBytes is the size past which appends go to a new segment, and
// lockTimeout how long Open waits for another process's lock
// (variables for the tests).
var (
	segmentBytes int64 = 64 << 20
	lockTimeout        = 5 * time.Second
)

// errKeyNotFound is what hashicorp/raft expects from a StableStore for a
// key never set (it compares the message).
var errKeyNotFound = errors.New("not found")

// ErrCorrupt is returned for a log entry that fails its checksum or
// does not decode, and for a log or stable file that does not parse.
var ErrCorrupt = errors.New("raftlog: corrupt Raft log entry")

// ErrNoLog is returned (wrapped, with the reason) by OpenReadOnly for a
// directory without a log it can read: none, or one of an earlier version
// that only Open migrates.
var ErrNoLog = errors.New("raftlog: no Raft log")

// ErrRaced marks a read that may have raced with the process writing the
// log (a segment removed by compaction between listing and opening it):
// reading again may succeed.
var ErrRaced = errors.New("raftlog: read raced with the log's writer")

// castagnoli is the CRC32C table of the records' checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errReadOnlyLog = errors.New("raftlog: the Raft log is open read-only")

// Open opens (creating if needed) the log store in dir, taking its
// lock (waiting up to 5 s for another process to release it). A bbolt log
// of an earlier version in dir (log.db) is migrated into it.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, walDir), 0o755); err != nil {
		return nil, fmt.Errorf("raftlog: creating the Raft log directory: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, lockFile), lockTimeout)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, lock: lock}
	if err := s.load(); err != nil {
		s.Close()
		return nil, err
	}
	if err := migrateBolt(dir, s); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// ErrInUse is returned (wrapped) by InUse for a log another open Store
// holds.
var ErrInUse = errors.New("raftlog: the Raft log is in use by another process")

// InUse reports, without waiting, whether a Store is open for writing on
// the log in dir (its lock is held): an error wrapping ErrInUse if so, nil
// if not or if dir holds no log. It is an early, friendly check (a command
// asks before loading its data); Open still takes the lock.
func InUse(dir string) error {
	f, err := os.Open(filepath.Join(dir, lockFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("raftlog: Raft log lock: %w", err)
	}
	defer f.Close()
	switch err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		return fmt.Errorf("%w: %s", ErrInUse, dir)
	case err != nil:
		return fmt.Errorf("raftlog: Raft log lock: %w", err)
	}
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}

// SetSegmentBytes sets the size past which appends go to a new segment
// (n ≤ 0: the default, 64 MiB). Compaction frees disk a whole segment at a
// time, so the log's disk use after a compaction exceeds what Raft keeps
// by up to one segment: a replica sizes segments to its model (a g̃ entry
// of 4·dim bytes), so that this slack is at most about one entry at any
// model size. It applies to the next append.
func (s *Store) SetSegmentBytes(n int64) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.segBytes = max(n, 0)
}

// OpenReadOnly opens the log store in dir for reading, without its lock
// and without changing any file: an incomplete entry at the end is ignored,
// not cut off. A replica may be appending and compacting meanwhile; the
// entries it reads are checksummed, and a file it cannot find is reported
// as ErrRaced.
func OpenReadOnly(dir string) (*Store, error) {
	if _, err := os.Stat(filepath.Join(dir, boltLogFile)); err == nil {
		return nil, fmt.Errorf("%w: %s holds a Raft log of an earlier version (%s); start the replica once to migrate it",
			ErrNoLog, dir, boltLogFile)
	}
	if _, err := os.Stat(filepath.Join(dir, walDir)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: no Raft log at %s", ErrNoLog, dir)
		}
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	s := &Store{dir: dir, readOnly: true}
	if err := s.load(); err != nil {
		s.Close()
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", ErrRaced, err)
		}
		return nil, err
	}
	return s, nil
}

// Close closes the files and releases the lock.
func (s *Store) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, g := range s.segs {
		errs = append(errs, g.f.Close())
	}
	s.segs, s.pos, s.first = nil, nil, 0
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // closing releases the flock
		s.lock = nil
	}
	return errors.Join(errs...)
}

// lockDir takes an exclusive flock on path, retrying until timeout.
func lockDir(path string, timeout time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("raftlog: Raft log lock: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("raftlog: the Raft log %s is in use by another process: %w", filepath.Dir(path), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FirstIndex implements raft.LogStore.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.first, nil
}

// LastIndex implements raft.LogStore.
func (s *Store) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lastLocked(), nil
}

func (s *Store) lastLocked() uint64 {
	if s.first == 0 {
		return 0
	}
	return s.first + uint64(len(s.pos)) - 1
}

// IsMonotonic implements raft.MonotonicLogStore: the log holds no gaps, so
// Raft removes every entry before it installs a snapshot.
func (s *Store) IsMonotonic() bool { return true }

// GetLog implements raft.LogStore.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.first == 0 || index < s.first || index > s.lastLocked() {
		return raft.ErrLogNotFound
	}
	return s.readRecord(s.pos[index-s.first], index, l)
}

// StoreLog implements raft.LogStore.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore: the entries, which must follow the
// last one, are written at the end of the newest segment, which is
// fsynced once; they are visible, and durable, when it returns. On an
// error (a full disk) the log is as it was.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if s.readOnly {
		return errReadOnlyLog
	}
	if len(logs) == 0 {
		return nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	next := s.lastLocked() + 1
	if s.first == 0 {
		next = logs[0].Index
	}
	limit := segmentBytes
	if s.segBytes > 0 {
		limit = s.segBytes
	}
	var g *segment
	if n := len(s.segs); n > 0 && s.segs[n-1].size < limit {
		g = s.segs[n-1]
	}
	s.mu.RUnlock()
	for i, l := range logs {
		if l.Index != next+uint64(i) {
			return fmt.Errorf("raftlog: Raft log entry %d does not follow entry %d (the log has no gaps)", l.Index, next+uint64(i)-1)
		}
		if uint64(len(l.Data)) > maxRecord/2 || uint64(len(l.Extensions)) > maxRecord/2 {
			return fmt.Errorf("raftlog: Raft log entry %d of %d bytes is too large", l.Index, len(l.Data)+len(l.Extensions))
		}
	}
	if h, ok := s.stable[headKey]; ok && len(h) == 8 && next < binary.BigEndian.Uint64(h) {
		// An empty log restarting below its recorded head (Raft does not
		// do this): lower the head first, or a reopen would skip entries.
		if err := s.setLocked(headKey, binary.BigEndian.AppendUint64(nil, next)); err != nil {
			return err
		}
	}
	created := g == nil
	if created {
		var err error
		if g, err = s.createSegment(next); err != nil {
			return err
		}
	}
	pos, end, err := writeRecords(g, logs)
	if err == nil {
		err = g.f.Sync()
	}
	if err != nil {
		// Leave the log as it was: nothing past g.size was published.
		if created {
			g.f.Close()
			os.Remove(g.f.Name())
		} else {
			g.f.Truncate(g.size)
		}
		return fmt.Errorf("raftlog: appending Raft log entries %d..%d: %w", next, next+uint64(len(logs))-1, err)
	}
	s.mu.Lock()
	if created {
		s.segs = append(s.segs, g)
	}
	if s.first == 0 {
		s.first = next
	}
	s.pos = append(s.pos, pos...)
	g.size = end
	s.mu.Unlock()
	return nil
}

// DeleteRange implements raft.LogStore: it deletes entries min..max
// inclusive, which must be the log's head (after a snapshot) or its tail
// (a conflicting suffix).
func (s *Store) DeleteRange(min, max uint64) error {
	if s.readOnly {
		return errReadOnlyLog
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	first, last := s.first, s.lastLocked()
	s.mu.RUnlock()
	switch {
	case first == 0 || max < first || min > last:
		return nil
	case min <= first:
		return s.deleteHead(max)
	case max >= last:
		return s.deleteTail(min)
	default:
		return fmt.Errorf("raftlog: deleting Raft log entries %d..%d from %d..%d: only a head or a tail can be deleted", min, max, first, last)
	}
}

// deleteHead deletes the entries up to max: it records the new head, then
// removes the segments that hold only entries before it.
func (s *Store) deleteHead(max uint64) error {
	if err := s.setLocked(headKey, binary.BigEndian.AppendUint64(nil, max+1)); err != nil {
		return err
	}
	s.mu.Lock()
	var drop []*segment
	if max >= s.lastLocked() {
		drop, s.segs, s.pos, s.first = s.segs, nil, nil, 0
	} else {
		n := max + 1 - s.first
		s.pos = slices.Clone(s.pos[n:]) // not pinning the old array
		s.first = max + 1
		for len(s.segs) > 1 && s.segs[1].first <= s.first {
			drop, s.segs = append(drop, s.segs[0]), s.segs[1:]
		}
	}
	s.mu.Unlock()
	return s.removeSegments(drop)
}

// deleteTail deletes the entries from min on: the segments after the one
// holding min, newest first, then that segment is cut.
func (s *Store) deleteTail(min uint64) error {
	s.mu.Lock()
	p := s.pos[min-s.first]
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].first > min }) - 1
	drop := slices.Clone(s.segs[i+1:])
	cut := s.segs[i]
	s.segs = s.segs[:i+1]
	s.pos = s.pos[:min-s.first]
	if len(s.pos) == 0 {
		s.first = 0
	}
	if p.off == 0 {
		drop = append(drop, cut)
		s.segs = s.segs[:i]
	}
	s.mu.Unlock()
	slices.Reverse(drop)
	if err := s.removeSegments(drop); err != nil {
		return err
	}
	if p.off == 0 {
		return nil
	}
	if err := cut.f.Truncate(p.off); err != nil {
		return fmt.Errorf("raftlog: deleting Raft log entries from %d: %w", min, err)
	}
	if err := cut.f.Sync(); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	s.mu.Lock()
	cut.size = p.off
	s.mu.Unlock()
	return nil
}

// removeSegments closes and removes segs, in order, then syncs the
// directory.
func (s *Store) removeSegments(segs []*segment) error {
	if len(segs) == 0 {
		return nil
	}
	for _, g := range segs {
		g.f.Close()
		if err := os.Remove(g.f.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("raftlog: removing Raft log segment: %w", err)
		}
	}
	return syncDir(filepath.Join(s.dir, walDir))
}

// syncDir fsyncs a directory, making the creation, removal or renaming of
// its entries durable.
func syncDir(dir string) error {
	if err := durable.SyncDir(dir); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	return nil
}

var (
	_ raft.LogStore          = (*Store)(nil)
	_ raft.StableStore       = (*Store)(nil)
	_ raft.MonotonicLogStore = (*Store)(nil)
)

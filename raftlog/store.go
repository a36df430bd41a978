package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
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

// load reads the stable file and every segment's headers.
func (s *Store) load() error {
	stable, err := readStable(filepath.Join(s.dir, stableFile))
	if err != nil {
		return err
	}
	s.stable = stable
	var head uint64
	if v, ok := stable[headKey]; ok {
		if len(v) != 8 {
			return fmt.Errorf("%w: stable key %q holds %d bytes", ErrCorrupt, headKey, len(v))
		}
		head = binary.BigEndian.Uint64(v)
	}
	names, err := s.segmentNames()
	if err != nil {
		return err
	}
	for i, first := range names {
		last := i == len(names)-1
		if err := s.loadSegment(first, last, head); err != nil {
			return err
		}
	}
	return nil
}

// segmentNames lists the segments' first indexes, in order.
func (s *Store) segmentNames() ([]uint64, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, walDir))
	if err != nil {
		return nil, fmt.Errorf("raftlog: reading the Raft log directory: %w", err)
	}
	var out []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), segSuffix)
		if !ok {
			continue
		}
		first, err := strconv.ParseUint(name, 10, 64)
		if err != nil || first == 0 {
			return nil, fmt.Errorf("%w: unexpected file %s in the Raft log directory", ErrCorrupt, e.Name())
		}
		out = append(out, first)
	}
	slices.Sort(out)
	return out, nil
}

func (s *Store) segmentPath(first uint64) string {
	return filepath.Join(s.dir, walDir, fmt.Sprintf("%020d%s", first, segSuffix))
}

// loadSegment scans the headers of the segment named first and indexes its
// entries from head on. newest says whether it is the last segment, the
// only one whose end may be an incomplete append.
func (s *Store) loadSegment(first uint64, newest bool, head uint64) error {
	path := s.segmentPath(first)
	flag := os.O_RDWR
	if s.readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return fmt.Errorf("raftlog: opening Raft log segment: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("raftlog: %w", err)
	}
	g := &segment{first: first, f: f}
	end := info.Size()
	var found []recordPos
	var hdr [recHeader]byte
	next := first
	for g.size < end {
		off := g.size
		p, index, err := readHeader(f, off, end, hdr[:])
		if err == nil && index != next {
			err = fmt.Errorf("%w: entry %d where %d was expected", ErrCorrupt, index, next)
		}
		if err == nil && off+p.size() == end && newest {
			// The newest entry is checksummed now: a crash may have
			// written its header but not all of its data.
			var l raft.Log
			err = s.readRecord(recordPos{seg: g, off: off, dataLen: p.dataLen, extLen: p.extLen}, index, &l)
		}
		if err != nil {
			if newest && tornTail(f, off, end, next) {
				break
			}
			f.Close()
			return fmt.Errorf("%s at offset %d: %w", path, off, err)
		}
		p.seg, p.off = g, off
		found = append(found, p)
		g.size += p.size()
		next++
	}
	if g.size < end && !s.readOnly {
		// Cut off the incomplete append, durably, before anything is
		// written after it.
		if err := f.Truncate(g.size); err != nil {
			f.Close()
			return fmt.Errorf("raftlog: cutting an incomplete entry off %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("raftlog: %w", err)
		}
	}
	if len(found) == 0 || next <= head {
		// Empty, or deleted by a compaction that stopped before removing
		// the file.
		f.Close()
		if s.readOnly {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("raftlog: %w", err)
		}
		return syncDir(filepath.Join(s.dir, walDir))
	}
	if skip := head - min(head, first); skip > 0 {
		found = found[skip:]
		first += skip
	}
	if s.first != 0 && s.first+uint64(len(s.pos)) != first {
		f.Close()
		return fmt.Errorf("%w: segment %s starts at %d, after %d", ErrCorrupt, path, first, s.first+uint64(len(s.pos))-1)
	}
	if s.first == 0 {
		s.first = first
	}
	s.pos = append(s.pos, found...)
	s.segs = append(s.segs, g)
	return nil
}

// tornTail reports whether the bytes of f from off to end, where entry
// index was expected, can be an append cut short by a crash: fewer bytes
// than a header; or index's intact header with the file ending before or
// at the end of its entry (its data not all written); or zeros (a file
// system may extend a file before it writes the data).
func tornTail(f *os.File, off, end int64, index uint64) bool {
	if end-off < recHeader {
		return true
	}
	var hdr [recHeader]byte
	if _, err := f.ReadAt(hdr[:], off); err != nil {
		return false
	}
	if crc32.Checksum(hdr[:recHeader-4], castagnoli) == binary.LittleEndian.Uint32(hdr[recHeader-4:]) {
		p := recordPos{dataLen: binary.LittleEndian.Uint32(hdr[24:]), extLen: binary.LittleEndian.Uint32(hdr[28:])}
		return binary.LittleEndian.Uint64(hdr[0:]) == index && off+p.size() >= end
	}
	buf := make([]byte, min(end-off, 1<<20))
	for o := off; o < end; o += int64(len(buf)) {
		n, _ := f.ReadAt(buf, o)
		if n == 0 || slices.ContainsFunc(buf[:n], func(b byte) bool { return b != 0 }) {
			return false
		}
	}
	return true
}

// readHeader reads and checks the header at off of a file of end bytes.
func readHeader(f *os.File, off, end int64, hdr []byte) (recordPos, uint64, error) {
	if end-off < recHeader {
		return recordPos{}, 0, fmt.Errorf("%w: %d bytes left, a header is %d", ErrCorrupt, end-off, recHeader)
	}
	if _, err := f.ReadAt(hdr, off); err != nil {
		return recordPos{}, 0, fmt.Errorf("raftlog: reading the Raft log: %w", err)
	}
	if crc32.Checksum(hdr[:recHeader-4], castagnoli) != binary.LittleEndian.Uint32(hdr[recHeader-4:]) {
		return recordPos{}, 0, fmt.Errorf("%w: header checksum mismatch", ErrCorrupt)
	}
	p := recordPos{dataLen: binary.LittleEndian.Uint32(hdr[24:]), extLen: binary.LittleEndian.Uint32(hdr[28:])}
	if p.size() > maxRecord || off+p.size() > end {
		return recordPos{}, 0, fmt.Errorf("%w: an entry of %d bytes at offset %d of a %d-byte segment", ErrCorrupt, p.size(), off, end)
	}
	return p, binary.LittleEndian.Uint64(hdr[0:]), nil
}

// putHeader writes l's header into hdr.
func putHeader(hdr []byte, l *raft.Log) {
	binary.LittleEndian.PutUint64(hdr[0:], l.Index)
	binary.LittleEndian.PutUint64(hdr[8:], l.Term)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	binary.LittleEndian.PutUint64(hdr[16:], uint64(at))
	binary.LittleEndian.PutUint32(hdr[24:], uint32(len(l.Data)))
	binary.LittleEndian.PutUint32(hdr[28:], uint32(len(l.Extensions)))
	hdr[32] = byte(l.Type)
	binary.LittleEndian.PutUint32(hdr[33:], crc32.Checksum(hdr[:33], castagnoli))
}

// readRecord reads the entry at p, which must be index, into l, checking
// both checksums. l's slices are its own.
func (s *Store) readRecord(p recordPos, index uint64, l *raft.Log) error {
	buf := make([]byte, p.size())
	if _, err := p.seg.f.ReadAt(buf, p.off); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: entry %d is cut short", ErrCorrupt, index)
		}
		return fmt.Errorf("raftlog: reading Raft log entry %d: %w", index, err)
	}
	hdr, body := buf[:recHeader], buf[recHeader:len(buf)-4]
	hcrc := binary.LittleEndian.Uint32(hdr[33:])
	if crc32.Checksum(hdr[:33], castagnoli) != hcrc ||
		crc32.Update(hcrc, castagnoli, body) != binary.LittleEndian.Uint32(buf[len(buf)-4:]) {
		return fmt.Errorf("%w: entry %d: checksum mismatch", ErrCorrupt, index)
	}
	if got := binary.LittleEndian.Uint64(hdr[0:]); got != index {
		return fmt.Errorf("%w: entry %d holds index %d", ErrCorrupt, index, got)
	}
	*l = raft.Log{
		Index: index,
		Term:  binary.LittleEndian.Uint64(hdr[8:]),
		Type:  raft.LogType(hdr[32]),
	}
	if at := int64(binary.LittleEndian.Uint64(hdr[16:])); at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	if p.dataLen > 0 {
		l.Data = body[:p.dataLen:p.dataLen]
	}
	if p.extLen > 0 {
		l.Extensions = body[p.dataLen:]
	}
	return nil
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

// writeRecords writes logs at the end of g (not synced) and returns their
// positions and g's new end. Small entries are gathered into one write;
// a large one's data is written from its own slice, not copied.
func writeRecords(g *segment, logs []*raft.Log) ([]recordPos, int64, error) {
	const gather = 256 << 10
	pos := make([]recordPos, len(logs))
	off := g.size
	var buf []byte
	bufOff := off
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		_, err := g.f.WriteAt(buf, bufOff)
		bufOff += int64(len(buf))
		buf = buf[:0]
		return err
	}
	for i, l := range logs {
		var hdr [recHeader]byte
		putHeader(hdr[:], l)
		crc := binary.LittleEndian.Uint32(hdr[33:])
		crc = crc32.Update(crc, castagnoli, l.Data)
		crc = crc32.Update(crc, castagnoli, l.Extensions)
		pos[i] = recordPos{seg: g, off: off, dataLen: uint32(len(l.Data)), extLen: uint32(len(l.Extensions))}
		off += pos[i].size()
		if len(l.Data)+len(l.Extensions) < gather {
			buf = append(buf, hdr[:]...)
			buf = append(buf, l.Data...)
			buf = append(buf, l.Extensions...)
			buf = binary.LittleEndian.AppendUint32(buf, crc)
			if len(buf) >= gather {
				if err := flush(); err != nil {
					return nil, 0, err
				}
			}
			continue
		}
		buf = append(buf, hdr[:]...)
		if err := flush(); err != nil {
			return nil, 0, err
		}
		for _, part := range [][]byte{l.Data, l.Extensions} {
			if len(part) == 0 {
				continue
			}
			if _, err := g.f.WriteAt(part, bufOff); err != nil {
				return nil, 0, err
			}
			bufOff += int64(len(part))
		}
		buf = binary.LittleEndian.AppendUint32(buf, crc)
	}
	if err := flush(); err != nil {
		return nil, 0, err
	}
	return pos, off, nil
}

// createSegment creates the (empty) segment whose first entry is first.
func (s *Store) createSegment(first uint64) (*segment, error) {
	path := s.segmentPath(first)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("raftlog: creating Raft log segment: %w", err)
	}
	if err := syncDir(filepath.Join(s.dir, walDir)); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return &segment{first: first, f: f}, nil
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

// Set implements raft.StableStore.
func (s *Store) Set(key, val []byte) error {
	if string(key) == headKey {
		return fmt.Errorf("raftlog: stable key %q is reserved", key)
	}
	if s.readOnly {
		return errReadOnlyLog
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.setLocked(string(key), val)
}

// setLocked writes the stable file with key set to val; s.wmu is held.
func (s *Store) setLocked(key string, val []byte) error {
	s.mu.RLock()
	next := make(map[string][]byte, len(s.stable)+1)
	for k, v := range s.stable {
		next[k] = v
	}
	s.mu.RUnlock()
	next[key] = slices.Clone(val)
	if err := writeStable(filepath.Join(s.dir, stableFile), next); err != nil {
		return err
	}
	s.mu.Lock()
	s.stable = next
	s.mu.Unlock()
	return nil
}

// Get implements raft.StableStore.
func (s *Store) Get(key []byte) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.stable[string(key)]
	if !ok || string(key) == headKey {
		return nil, errKeyNotFound
	}
	return slices.Clone(v), nil
}

// SetUint64 implements raft.StableStore.
func (s *Store) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 implements raft.StableStore.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: stable key %q holds %d bytes", ErrCorrupt, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// The stable file: stableMagic, the number of keys (uint32), each key
// and value with uint32 lengths, in key order, and a CRC32C of all of it.

func writeStable(path string, kv map[string][]byte) error {
	b := []byte(stableMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(kv)))
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(kv[k])))
		b = append(b, kv[k]...)
	}
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	err := durable.Replace(path, 0o644, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
	if err != nil {
		return fmt.Errorf("raftlog: writing Raft stable store: %w", err)
	}
	return nil
}

func readStable(path string) (map[string][]byte, error) {
	kv := make(map[string][]byte)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return kv, nil
	}
	if err != nil {
		return nil, fmt.Errorf("raftlog: reading Raft stable store: %w", err)
	}
	bad := fmt.Errorf("%w: %s does not parse", ErrCorrupt, path)
	if len(b) < len(stableMagic)+8 || string(b[:len(stableMagic)]) != stableMagic ||
		crc32.Checksum(b[:len(b)-4], castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, bad
	}
	r := b[len(stableMagic) : len(b)-4]
	field := func() ([]byte, bool) {
		if len(r) < 4 {
			return nil, false
		}
		n := binary.LittleEndian.Uint32(r)
		if uint64(len(r)-4) < uint64(n) {
			return nil, false
		}
		f := r[4 : 4+n]
		r = r[4+n:]
		return f, true
	}
	n := binary.LittleEndian.Uint32(r)
	r = r[4:]
	for range n {
		k, ok1 := field()
		v, ok2 := field()
		if !ok1 || !ok2 {
			return nil, bad
		}
		kv[string(k)] = slices.Clone(v)
	}
	if len(r) != 0 {
		return nil, bad
	}
	return kv, nil
}

// resetForMigration empties s (a migration cut short left entries in it)
// and writes stable as its stable keys.
func (s *Store) resetForMigration(stable map[string][]byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	drop := s.segs
	s.segs, s.pos, s.first = nil, nil, 0
	s.mu.Unlock()
	if err := s.removeSegments(drop); err != nil {
		return err
	}
	delete(stable, headKey)
	if err := writeStable(filepath.Join(s.dir, stableFile), stable); err != nil {
		return err
	}
	s.mu.Lock()
	s.stable = stable
	s.mu.Unlock()
	return nil
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

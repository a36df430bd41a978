package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// This file reads and writes the segment files: loading them on open (the
// torn-tail repair), the entry format (putHeader, readHeader, readRecord)
// and appending entries (writeRecords, createSegment).

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
	found, next, err := s.scanSegment(g, path, end, newest)
	if err != nil {
		f.Close()
		return err
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

// scanSegment reads the headers of g, a file of end bytes at path, from
// g.size on, advancing g.size past each whole entry, and returns the
// entries' positions and the index after the last. In the newest segment
// the last entry is checksummed in full, and a torn tail (tornTail) ends
// the scan; anywhere else a damaged header is an error.
func (s *Store) scanSegment(g *segment, path string, end int64, newest bool) ([]recordPos, uint64, error) {
	f := g.f
	var found []recordPos
	var hdr [recHeader]byte
	next := g.first
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
			return nil, 0, fmt.Errorf("%s at offset %d: %w", path, off, err)
		}
		p.seg, p.off = g, off
		found = append(found, p)
		g.size += p.size()
		next++
	}
	return found, next, nil
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

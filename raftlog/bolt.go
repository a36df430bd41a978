package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// This file reads the Raft log of earlier versions: one bbolt file,
// raft/log.db, holding the entries by index in bucket "logs" and Raft's
// stable keys in bucket "stable". Open migrates such a file into
// the segment log once (migrateBolt) and removes it.

var (
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
)

// boltLogFile is the earlier versions' log file in the Raft directory.
const boltLogFile = "log.db"

// migrateBolt moves the entries and stable keys of dir/log.db, if that
// file exists, into s (empty: a migration cut short is started over), and
// removes log.db once they are durable. A gap in the old log's indexes
// (Raft left one after installing a snapshot into a store that tolerated
// it) starts the log over after the gap, as Raft would have.
func migrateBolt(dir string, s *Store) error {
	path := filepath.Join(dir, boltLogFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	db, err := bolt.Open(path, 0o644, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("raftlog: opening the bbolt Raft log %s to migrate it: %w", path, err)
	}
	defer db.Close()
	stable := make(map[string][]byte)
	var logs []*raft.Log
	err = db.View(func(tx *bolt.Tx) error {
		sb, lb := tx.Bucket(bucketStable), tx.Bucket(bucketLogs)
		if sb == nil || lb == nil {
			return fmt.Errorf("%w: %s has no Raft log buckets", ErrCorrupt, path)
		}
		if err := sb.ForEach(func(k, v []byte) error {
			stable[string(k)] = append([]byte(nil), v...)
			return nil
		}); err != nil {
			return err
		}
		return lb.ForEach(func(k, v []byte) error {
			l := new(raft.Log)
			if err := decodeLog(v, l); err != nil {
				return fmt.Errorf("%s entry %d: %w", path, binary.BigEndian.Uint64(k), err)
			}
			if n := len(logs); n > 0 && logs[n-1].Index+1 != l.Index {
				logs = logs[:0]
			}
			logs = append(logs, l)
			return nil
		})
	})
	if err != nil {
		return err
	}
	if err := s.resetForMigration(stable); err != nil {
		return err
	}
	for len(logs) > 0 {
		n, size := 0, int64(0)
		for n < len(logs) && size < segmentBytes {
			size += int64(len(logs[n].Data))
			n++
		}
		if err := s.StoreLogs(logs[:n]); err != nil {
			return fmt.Errorf("raftlog: migrating %s: %w", path, err)
		}
		logs = logs[n:]
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("raftlog: migrated %s but cannot remove it: %w", path, err)
	}
	return syncDir(dir)
}

// logHeader is index, term, append time (Unix ns), data and extensions
// lengths (8+8+8+4+4), then the type byte.
const logHeader = 33

// decodeLog decodes v, which bbolt owns only for the transaction: the
// slices put in l are copies.
func decodeLog(v []byte, l *raft.Log) error {
	if len(v) < logHeader+4 {
		return fmt.Errorf("%w: %d bytes", ErrCorrupt, len(v))
	}
	body, sum := v[:len(v)-4], binary.LittleEndian.Uint32(v[len(v)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	nd, ne := int(binary.LittleEndian.Uint32(body[24:])), int(binary.LittleEndian.Uint32(body[28:]))
	if logHeader+nd+ne != len(body) {
		return fmt.Errorf("%w: lengths %d+%d do not fit %d bytes", ErrCorrupt, nd, ne, len(body))
	}
	*l = raft.Log{
		Index: binary.LittleEndian.Uint64(body[0:]),
		Term:  binary.LittleEndian.Uint64(body[8:]),
		Type:  raft.LogType(body[32]),
	}
	if at := int64(binary.LittleEndian.Uint64(body[16:])); at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	if nd > 0 {
		l.Data = append([]byte(nil), body[logHeader:logHeader+nd]...)
	}
	if ne > 0 {
		l.Extensions = append([]byte(nil), body[logHeader+nd:]...)
	}
	return nil
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

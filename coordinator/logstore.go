package coordinator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// LogStore is the replica's durable Raft log and stable store: one bbolt
// file (B+tree, copy-on-write pages, fsync at every commit) holding the log
// entries by index and Raft's few stable keys (current term, last vote).
//
// It replaces raft-wal v0.4.0 (the latest release), which leaves a log
// that cannot be reopened after Raft truncates its tail and the process
// restarts ("sealed segment has no index block", hashicorp/raft-wal#31;
// the fix is unreleased). TestProcessFailoverSoak hit exactly that. bbolt
// is slower for large entries, but a replica must always come back.
//
// Each entry is stored as a fixed header (index, term, type, append time,
// data and extension lengths), the data, the extensions, and a CRC32C of
// all of it, so a damaged value is reported rather than applied.
type LogStore struct {
	db *bolt.DB
}

var (
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
)

// errKeyNotFound is what hashicorp/raft expects from a StableStore for a
// key never set (it compares the message).
var errKeyNotFound = errors.New("not found")

// ErrLogCorrupt is returned for a log entry that fails its checksum or
// does not decode.
var ErrLogCorrupt = errors.New("coordinator: corrupt Raft log entry")

// OpenLogStore opens (creating if needed) the log store file at path.
func OpenLogStore(path string) (*LogStore, error) {
	db, err := bolt.Open(path, 0o644, &bolt.Options{Timeout: 5 * time.Second, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("coordinator: opening Raft log %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLogs, bucketStable} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("coordinator: initializing Raft log %s: %w", path, err)
	}
	return &LogStore{db: db}, nil
}

// Close closes the file.
func (s *LogStore) Close() error { return s.db.Close() }

func indexKey(i uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], i)
	return k[:]
}

// FirstIndex implements raft.LogStore.
func (s *LogStore) FirstIndex() (uint64, error) { return s.edge(true) }

// LastIndex implements raft.LogStore.
func (s *LogStore) LastIndex() (uint64, error) { return s.edge(false) }

func (s *LogStore) edge(first bool) (uint64, error) {
	var idx uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketLogs).Cursor()
		k, _ := c.Last()
		if first {
			k, _ = c.First()
		}
		if k != nil {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return idx, err
}

// GetLog implements raft.LogStore.
func (s *LogStore) GetLog(index uint64, l *raft.Log) error {
	return s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketLogs).Get(indexKey(index))
		if v == nil {
			return raft.ErrLogNotFound
		}
		return decodeLog(v, l)
	})
}

// StoreLog implements raft.LogStore.
func (s *LogStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore: all entries in one transaction,
// durable (fsynced) when it returns.
func (s *LogStore) StoreLogs(logs []*raft.Log) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		for _, l := range logs {
			if err := b.Put(indexKey(l.Index), encodeLog(l)); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteRange implements raft.LogStore: it deletes entries min..max
// inclusive (the head after a snapshot, or a conflicting tail).
func (s *LogStore) DeleteRange(min, max uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketLogs).Cursor()
		for k, _ := c.Seek(indexKey(min)); k != nil && binary.BigEndian.Uint64(k) <= max; k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Set implements raft.StableStore.
func (s *LogStore) Set(key, val []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketStable).Put(key, val) })
}

// Get implements raft.StableStore.
func (s *LogStore) Get(key []byte) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketStable).Get(key)
		if v == nil {
			return errKeyNotFound
		}
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

// SetUint64 implements raft.StableStore.
func (s *LogStore) SetUint64(key []byte, val uint64) error { return s.Set(key, indexKey(val)) }

// GetUint64 implements raft.StableStore.
func (s *LogStore) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: stable key %q holds %d bytes", ErrLogCorrupt, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// logHeader is index, term, append time (Unix ns), data and extensions
// lengths (8+8+8+4+4), then the type byte.
const logHeader = 33

func encodeLog(l *raft.Log) []byte {
	b := make([]byte, logHeader, logHeader+len(l.Data)+len(l.Extensions)+4)
	binary.LittleEndian.PutUint64(b[0:], l.Index)
	binary.LittleEndian.PutUint64(b[8:], l.Term)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	binary.LittleEndian.PutUint64(b[16:], uint64(at))
	binary.LittleEndian.PutUint32(b[24:], uint32(len(l.Data)))
	binary.LittleEndian.PutUint32(b[28:], uint32(len(l.Extensions)))
	b[32] = byte(l.Type)
	b = append(b, l.Data...)
	b = append(b, l.Extensions...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeLog decodes v, which bbolt owns only for the transaction: the
// slices put in l are copies.
func decodeLog(v []byte, l *raft.Log) error {
	if len(v) < logHeader+4 {
		return fmt.Errorf("%w: %d bytes", ErrLogCorrupt, len(v))
	}
	body, sum := v[:len(v)-4], binary.LittleEndian.Uint32(v[len(v)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return fmt.Errorf("%w: checksum mismatch", ErrLogCorrupt)
	}
	nd, ne := int(binary.LittleEndian.Uint32(body[24:])), int(binary.LittleEndian.Uint32(body[28:]))
	if logHeader+nd+ne != len(body) {
		return fmt.Errorf("%w: lengths %d+%d do not fit %d bytes", ErrLogCorrupt, nd, ne, len(body))
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

var (
	_ raft.LogStore    = (*LogStore)(nil)
	_ raft.StableStore = (*LogStore)(nil)
)

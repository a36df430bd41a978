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

	"github.com/dpcluster/dpcluster/internal/durable"
)

// This file keeps Raft's stable keys (raft.StableStore) and the log's head
// in the stable file: stableMagic, the number of keys (uint32), each key
// and value with uint32 lengths, in key order, and a CRC32C of all of it,
// replaced atomically on every change.

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

package raftlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/crc64"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

// FuzzDecodeLog: the log store's value decoder rejects what it cannot
// verify and round-trips what it encodes.
func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(&raft.Log{Index: 9, Term: 2, Type: raft.LogCommand, Data: []byte("entry")}), uint64(9), []byte("entry"))
	f.Add([]byte{1, 2, 3}, uint64(1), []byte{})
	f.Fuzz(func(t *testing.T, v []byte, index uint64, data []byte) {
		var l raft.Log
		_ = decodeLog(v, &l)
		in := &raft.Log{Index: index, Term: index / 2, Type: raft.LogCommand, Data: data}
		if err := decodeLog(encodeLog(in), &l); err != nil || l.Index != index || !bytes.Equal(l.Data, data) {
			t.Fatalf("round trip of index %d, %d bytes: %+v, %v", index, len(data), l, err)
		}
	})
}

// FuzzLogSegment: whatever a segment file holds, opening the log store
// (read-only, then for writing) returns an error or a log whose every
// entry reads back or is reported as ErrCorrupt, never panics; and a
// log that opened for writing takes a new entry and reopens with it.
func FuzzLogSegment(f *testing.F) {
	dir := f.TempDir()
	s, err := Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("entry one")},
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: []byte("entry two"), Extensions: []byte("x")},
	}); err != nil {
		f.Fatal(err)
	}
	s.Close()
	seed, err := os.ReadFile(filepath.Join(dir, walDir, fmt.Sprintf("%020d%s", 1, segSuffix)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add(append(append([]byte(nil), seed...), make([]byte, 64)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, walDir), 0o755); err != nil {
			t.Fatal(err)
		}
		seg := filepath.Join(dir, walDir, fmt.Sprintf("%020d%s", 1, segSuffix))
		if err := os.WriteFile(seg, data, 0o644); err != nil {
			t.Fatal(err)
		}
		readAll := func(s *Store) uint64 {
			first, _ := s.FirstIndex()
			last, _ := s.LastIndex()
			for i := first; i != 0 && i <= last; i++ {
				var l raft.Log
				if err := s.GetLog(i, &l); err != nil && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("entry %d of %d..%d: %v", i, first, last, err)
				} else if err == nil && l.Index != i {
					t.Fatalf("entry %d reads as %d", i, l.Index)
				}
			}
			return last
		}
		if ro, err := OpenReadOnly(dir); err == nil {
			readAll(ro)
			ro.Close()
		}
		s, err := Open(dir)
		if err != nil {
			return
		}
		last := readAll(s)
		if err := s.StoreLog(&raft.Log{Index: last + 1, Term: 9, Type: raft.LogCommand, Data: []byte("new")}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = Open(dir)
		if err != nil {
			t.Fatalf("reopen after an append: %v", err)
		}
		defer s.Close()
		var l raft.Log
		if err := s.GetLog(last+1, &l); err != nil || string(l.Data) != "new" {
			t.Fatalf("the appended entry: %+v, %v", l, err)
		}
	})
}

// FuzzSnapshotOpen: whatever a snapshot's meta.json and state.bin hold,
// List and Open do not panic, and Open succeeds only for a state that
// matches the meta's checksum and size.
func FuzzSnapshotOpen(f *testing.F) {
	good := func(state []byte) []byte {
		crc := crc32.Checksum(state, castagnoli)
		b, _ := json.Marshal(snapshotMeta{SnapshotMeta: raft.SnapshotMeta{Version: 1, ID: "1-2-3", Index: 2, Term: 1,
			Size: int64(len(state))}, CRC32C: &crc})
		return b
	}
	f.Add(good([]byte("state")), []byte("state"))
	f.Add(good([]byte("state")), []byte("statf"))
	f.Add([]byte(`{"Version":1,"ID":"1-2-3","Size":1,"CRC":"AAAAAAAAAAA="}`), []byte("x"))
	f.Add([]byte(`{"Version":9,"ID":"1-2-3"}`), []byte{})
	f.Fuzz(func(t *testing.T, meta, state []byte) {
		base := t.TempDir()
		s, err := OpenSnapshots(base, 1)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(base, snapshotsDir, "1-2-3")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, metaFile), meta, 0o644)
		os.WriteFile(filepath.Join(dir, stateFile), state, 0o644)
		if _, err := s.List(); err != nil {
			t.Fatal(err)
		}
		m, rc, err := s.Open("1-2-3")
		if err != nil {
			return
		}
		defer rc.Close()
		var sm snapshotMeta
		if json.Unmarshal(meta, &sm) != nil || m.Size != int64(len(state)) {
			t.Fatalf("opened with meta %q for %d bytes", meta, len(state))
		}
		switch {
		case sm.CRC32C != nil:
			if crc32.Checksum(state, castagnoli) != *sm.CRC32C {
				t.Fatalf("opened with a wrong CRC32C")
			}
		case len(sm.CRC) == crc64.Size:
			h := crc64.New(crc64Table)
			h.Write(state)
			if !bytes.Equal(h.Sum(nil), sm.CRC) {
				t.Fatalf("opened with a wrong CRC64")
			}
		default:
			t.Fatalf("opened without a checksum: %q", meta)
		}
	})
}

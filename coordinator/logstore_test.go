package coordinator

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func openTestLogStore(t *testing.T, path string) *LogStore {
	t.Helper()
	s, err := OpenLogStore(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testLogs(from, to uint64, term uint64) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: term, Type: raft.LogCommand,
			Data: bytes.Repeat([]byte{byte(i)}, int(i%7)*100), AppendedAt: time.Unix(0, int64(i)*1e9)})
	}
	return out
}

func checkRange(t *testing.T, s *LogStore, first, last uint64) {
	t.Helper()
	f, err1 := s.FirstIndex()
	l, err2 := s.LastIndex()
	if err1 != nil || err2 != nil || f != first || l != last {
		t.Fatalf("range [%d, %d] (%v, %v), want [%d, %d]", f, l, err1, err2, first, last)
	}
}

// TestLogStoreContract: entries round-trip exactly, head and tail
// truncation (what Raft does after a snapshot and on a conflicting
// suffix) survive a reopen, and a new suffix can be written after a tail
// truncation — the sequence raft-wal v0.4.0 could not reopen after.
func TestLogStoreContract(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	s := openTestLogStore(t, path)
	checkRange(t, s, 0, 0)
	if err := s.GetLog(1, new(raft.Log)); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog on empty store: %v", err)
	}
	want := testLogs(1, 100, 1)
	if err := s.StoreLogs(want); err != nil {
		t.Fatal(err)
	}
	var got raft.Log
	for _, w := range want {
		if err := s.GetLog(w.Index, &got); err != nil {
			t.Fatal(err)
		}
		if got.Index != w.Index || got.Term != w.Term || got.Type != w.Type || !bytes.Equal(got.Data, w.Data) || !got.AppendedAt.Equal(w.AppendedAt) {
			t.Fatalf("entry %d: got %+v", w.Index, got)
		}
	}
	if err := s.DeleteRange(1, 40); err != nil { // compaction after a snapshot
		t.Fatal(err)
	}
	if err := s.DeleteRange(91, 100); err != nil { // conflicting suffix
		t.Fatal(err)
	}
	s.Close()
	s = openTestLogStore(t, path)
	defer s.Close()
	checkRange(t, s, 41, 90)
	if err := s.StoreLogs(testLogs(91, 95, 2)); err != nil {
		t.Fatal(err)
	}
	if err := s.GetLog(93, &got); err != nil || got.Term != 2 {
		t.Fatalf("rewritten suffix: %+v, %v", got, err)
	}
	if err := s.GetLog(40, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Errorf("compacted entry: %v", err)
	}
}

func TestLogStoreStable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	s := openTestLogStore(t, path)
	if _, err := s.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("missing key: %v (hashicorp/raft expects the message \"not found\")", err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("r2")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openTestLogStore(t, path)
	defer s.Close()
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Errorf("CurrentTerm = %d, %v", v, err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "r2" {
		t.Errorf("LastVoteCand = %q, %v", v, err)
	}
}

// TestLogStoreDetectsCorruption: a byte flipped inside a stored entry on
// disk is reported as ErrLogCorrupt, never returned as data.
func TestLogStoreDetectsCorruption(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	s := openTestLogStore(t, path)
	marker := bytes.Repeat([]byte("dpcluster-entry!"), 8)
	if err := s.StoreLog(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: marker}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, marker)
	if i < 0 {
		t.Fatal("entry not found in the file")
	}
	data[i+5] ^= 0x20
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s = openTestLogStore(t, path)
	defer s.Close()
	if err := s.GetLog(1, new(raft.Log)); !errors.Is(err, ErrLogCorrupt) {
		t.Errorf("GetLog of a damaged entry: %v, want ErrLogCorrupt", err)
	}
}

package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

func openTestLogStore(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
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

func checkRange(t *testing.T, s *Store, first, last uint64) {
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
	path := t.TempDir()
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
	path := t.TempDir()
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
// disk is reported as ErrCorrupt, never returned as data.
func TestLogStoreDetectsCorruption(t *testing.T) {
	path := t.TempDir()
	s := openTestLogStore(t, path)
	marker := bytes.Repeat([]byte("dpcluster-entry!"), 8)
	if err := s.StoreLog(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: marker}); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLog(&raft.Log{Index: 2, Term: 1, Type: raft.LogCommand, Data: []byte("next")}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	seg := onlySegment(t, path)
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, marker)
	if i < 0 {
		t.Fatal("entry not found in the file")
	}
	data[i+5] ^= 0x20
	if err := os.WriteFile(seg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s = openTestLogStore(t, path)
	defer s.Close()
	if err := s.GetLog(1, new(raft.Log)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("GetLog of a damaged entry: %v, want ErrCorrupt", err)
	}
}

// onlySegment returns the path of the single segment file of the log store
// in dir.
func onlySegment(t *testing.T, dir string) string {
	t.Helper()
	segs := segmentFiles(t, dir)
	if len(segs) != 1 {
		t.Fatalf("%d segment files, want 1", len(segs))
	}
	return segs[0]
}

func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, walDir, "*"+segSuffix))
	if err != nil {
		t.Fatal(err)
	}
	return segs
}

// smallSegments makes the log roll to a new segment past n bytes for the
// rest of the test.
func smallSegments(t *testing.T, n int64) {
	old := segmentBytes
	segmentBytes = n
	t.Cleanup(func() { segmentBytes = old })
}

func checkEntries(t *testing.T, s *Store, from, to, term uint64) {
	t.Helper()
	want := testLogs(from, to, term)
	var got raft.Log
	for _, w := range want {
		if err := s.GetLog(w.Index, &got); err != nil {
			t.Fatalf("entry %d: %v", w.Index, err)
		}
		if got.Index != w.Index || got.Term != w.Term || !bytes.Equal(got.Data, w.Data) {
			t.Fatalf("entry %d: got index %d term %d, %d bytes", w.Index, got.Index, got.Term, len(got.Data))
		}
	}
}

// TestLogStoreSegments: with segments of a few entries, appends roll to
// new files; a head deletion removes the files it empties (and only
// those), a tail deletion across segments removes the later files and
// cuts the one it starts in; each state survives a reopen.
func TestLogStoreSegments(t *testing.T) {
	smallSegments(t, 2000)
	dir := t.TempDir()
	s := openTestLogStore(t, dir)
	for i := uint64(1); i <= 60; i += 10 {
		if err := s.StoreLogs(testLogs(i, i+9, 1)); err != nil {
			t.Fatal(err)
		}
	}
	n := len(segmentFiles(t, dir))
	if n < 4 {
		t.Fatalf("%d segments for 60 entries of up to 600 bytes, want a roll", n)
	}
	reopen := func() {
		t.Helper()
		s.Close()
		s = openTestLogStore(t, dir)
	}
	reopen()
	checkRange(t, s, 1, 60)
	checkEntries(t, s, 1, 60, 1)

	if err := s.DeleteRange(1, 25); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, 26, 60)
	if m := len(segmentFiles(t, dir)); m >= n {
		t.Errorf("a head deletion left %d of %d segments", m, n)
	}
	reopen()
	checkRange(t, s, 26, 60)
	checkEntries(t, s, 26, 60, 1)
	if err := s.GetLog(25, new(raft.Log)); !errors.Is(err, raft.ErrLogNotFound) {
		t.Errorf("deleted entry 25: %v", err)
	}

	if err := s.DeleteRange(33, 60); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, 26, 32)
	reopen()
	checkRange(t, s, 26, 32)
	if err := s.StoreLogs(testLogs(33, 50, 2)); err != nil {
		t.Fatal(err)
	}
	reopen()
	checkRange(t, s, 26, 50)
	checkEntries(t, s, 26, 32, 1)
	checkEntries(t, s, 33, 50, 2)

	if err := s.StoreLogs(testLogs(52, 52, 2)); err == nil {
		t.Error("an entry after a gap was stored")
	}
	if err := s.DeleteRange(30, 40); err == nil {
		t.Error("a deletion inside the log was accepted")
	}
	// Everything, as Raft does before it installs a snapshot (the store
	// is monotonic); the log then starts again after the snapshot.
	if err := s.DeleteRange(26, 50); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, 0, 0)
	if len(segmentFiles(t, dir)) != 0 {
		t.Error("segments left after deleting every entry")
	}
	if err := s.StoreLogs(testLogs(101, 103, 3)); err != nil {
		t.Fatal(err)
	}
	reopen()
	defer s.Close()
	checkRange(t, s, 101, 103)
	checkEntries(t, s, 101, 103, 3)
}

// TestLogStoreCompactionCutShort: a head deletion records the new head
// before it removes files, so a crash between the two (the removed
// segment still there) does not bring the deleted entries back.
func TestLogStoreCompactionCutShort(t *testing.T) {
	smallSegments(t, 1500)
	dir := t.TempDir()
	s := openTestLogStore(t, dir)
	if err := s.StoreLogs(testLogs(1, 30, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs(testLogs(31, 40, 1)); err != nil {
		t.Fatal(err)
	}
	segs := segmentFiles(t, dir)
	saved := make(map[string][]byte)
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		saved[p] = b
	}
	if err := s.DeleteRange(1, 35); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for p, b := range saved { // the crash: the files come back
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s = openTestLogStore(t, dir)
	defer s.Close()
	checkRange(t, s, 36, 40)
	checkEntries(t, s, 36, 40, 1)
	if err := s.GetLog(35, new(raft.Log)); !errors.Is(err, raft.ErrLogNotFound) {
		t.Errorf("deleted entry 35: %v", err)
	}
}

// TestLogStoreTornAppend: what a crash in the middle of an append can
// leave at the end of the newest segment (part of a header, a header
// with part of its data, zeros, the last entry's data damaged) is cut off
// on open, the entries before it kept, and the log appends after it. A
// damaged header anywhere else is refused.
func TestLogStoreTornAppend(t *testing.T) {
	var whole bytes.Buffer
	full := &raft.Log{Index: 4, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{7}, 300)}
	var hdr [recHeader]byte
	putHeader(hdr[:], full)
	whole.Write(hdr[:])
	whole.Write(full.Data[:100])
	for _, tc := range []struct {
		name string
		tail func(seg []byte) []byte
	}{
		{"part of a header", func(seg []byte) []byte { return append(seg, hdr[:20]...) }},
		{"header and part of its data", func(seg []byte) []byte { return append(seg, whole.Bytes()...) }},
		{"zeros", func(seg []byte) []byte { return append(seg, make([]byte, 4096)...) }},
		{"last entry damaged", func(seg []byte) []byte { seg[len(seg)-10] ^= 1; return seg }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			seg, b := threeEntries(t, dir)
			damaged := tc.tail(b)
			if err := os.WriteFile(seg, damaged, 0o644); err != nil {
				t.Fatal(err)
			}
			ro, err := OpenReadOnly(dir)
			if err != nil {
				t.Fatalf("read-only open: %v", err)
			}
			ro.Close()
			if after, _ := os.ReadFile(seg); !bytes.Equal(after, damaged) {
				t.Error("the read-only open changed the segment")
			}
			s := openTestLogStore(t, dir)
			defer s.Close()
			last := uint64(3)
			if tc.name == "last entry damaged" {
				last = 2
			}
			checkRange(t, s, 1, last)
			checkEntries(t, s, 1, last, 1)
			if err := s.StoreLogs(testLogs(last+1, 6, 2)); err != nil {
				t.Fatal(err)
			}
			s.Close()
			s = openTestLogStore(t, dir)
			checkRange(t, s, 1, 6)
			checkEntries(t, s, last+1, 6, 2)
		})
	}
	t.Run("damaged header before the end", func(t *testing.T) {
		dir := t.TempDir()
		seg, b := threeEntries(t, dir)
		b[recHeader+len(testLogs(1, 1, 1)[0].Data)+4+9] ^= 1 // entry 2's term
		if err := os.WriteFile(seg, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if s, err := Open(dir); !errors.Is(err, ErrCorrupt) {
			if err == nil {
				s.Close()
			}
			t.Fatalf("Open = %v, want ErrCorrupt", err)
		}
	})
}

// threeEntries stores entries 1..3 in a new log store in dir, closes it
// and returns its segment's path and bytes.
func threeEntries(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	s := openTestLogStore(t, dir)
	if err := s.StoreLogs(testLogs(1, 3, 1)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	seg := onlySegment(t, dir)
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	return seg, b
}

// TestLogStoreLocked: a second process (here, a second store) cannot open
// a log that is open for writing.
func TestLogStoreLocked(t *testing.T) {
	old := lockTimeout
	lockTimeout = 100 * time.Millisecond
	t.Cleanup(func() { lockTimeout = old })
	dir := t.TempDir()
	s := openTestLogStore(t, dir)
	if s2, err := Open(dir); err == nil {
		s2.Close()
		t.Fatal("a second writer opened the log")
	}
	s.Close()
	openTestLogStore(t, dir).Close()
}

// TestLogStoreMigratesBolt: a Raft log of an earlier version (bbolt,
// raft/log.db) is moved into the segment log on open, entries and stable
// keys intact, and log.db is removed.
func TestLogStoreMigratesBolt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, boltLogFile)
	db, err := bolt.Open(path, 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		lb, err := tx.CreateBucket(bucketLogs)
		if err != nil {
			return err
		}
		sb, err := tx.CreateBucket(bucketStable)
		if err != nil {
			return err
		}
		for _, l := range testLogs(5, 40, 3) {
			if err := lb.Put(binary.BigEndian.AppendUint64(nil, l.Index), encodeLog(l)); err != nil {
				return err
			}
		}
		return sb.Put([]byte("CurrentTerm"), binary.BigEndian.AppendUint64(nil, 3))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenReadOnly(dir); err == nil {
		t.Error("a read-only open of an unmigrated log succeeded")
	}
	s := openTestLogStore(t, dir)
	checkRange(t, s, 5, 40)
	checkEntries(t, s, 5, 40, 3)
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 3 {
		t.Errorf("CurrentTerm = %d, %v", v, err)
	}
	s.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("log.db after the migration: %v", err)
	}
	s = openTestLogStore(t, dir)
	defer s.Close()
	checkRange(t, s, 5, 40)
}

// encodeLog encodes an entry as the bbolt log of earlier versions did: the
// segment header's first logHeader bytes (the same fields), the data, the
// extensions and a CRC32C of all of it.
func encodeLog(l *raft.Log) []byte {
	var hdr [recHeader]byte
	putHeader(hdr[:], l)
	b := append(hdr[:logHeader:logHeader], l.Data...)
	b = append(b, l.Extensions...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// BenchmarkLogStoreAppend appends one step-sized entry (d float32 of g̃)
// per operation, fsynced, as Raft does for every step, and in the same
// loop the same entry to a bbolt log the way the store of earlier versions
// did (one transaction: a Put of the encoded entry, then commit with
// fsync); each is timed, and old entries are deleted as compaction would.
// The ratio bbolt/segments is reported.
func BenchmarkLogStoreAppend(b *testing.B) {
	for _, d := range []int{269_322, 3_716_106} {
		b.Run(fmt.Sprintf("d=%d", d), func(b *testing.B) {
			dir := b.TempDir()
			s, err := Open(filepath.Join(dir, "raft"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			db, err := bolt.Open(filepath.Join(dir, "log.db"), 0o644, &bolt.Options{FreelistType: bolt.FreelistMapType})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bucketLogs); return err }); err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 4*d)
			for i := range data {
				data[i] = byte(i*2654435761>>13) | 1
			}
			var seg, old time.Duration
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := 1; i <= b.N; i++ {
				l := &raft.Log{Index: uint64(i), Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
				t0 := time.Now()
				if err := s.StoreLogs([]*raft.Log{l}); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				err := db.Update(func(tx *bolt.Tx) error {
					return tx.Bucket(bucketLogs).Put(binary.BigEndian.AppendUint64(nil, l.Index), encodeLog(l))
				})
				if err != nil {
					b.Fatal(err)
				}
				seg, old = seg+t1.Sub(t0), old+time.Since(t1)
				if i > 96 { // what SnapshotThreshold + TrailingLogs keep
					if err := s.DeleteRange(uint64(i-96), uint64(i-96)); err != nil {
						b.Fatal(err)
					}
					err := db.Update(func(tx *bolt.Tx) error {
						return tx.Bucket(bucketLogs).Delete(binary.BigEndian.AppendUint64(nil, uint64(i-96)))
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(seg.Microseconds())/float64(b.N)/1e3, "seg-ms/op")
			b.ReportMetric(float64(old.Microseconds())/float64(b.N)/1e3, "bbolt-ms/op")
			b.ReportMetric(float64(old)/float64(seg), "bbolt/seg")
		})
	}
}

// TestSetSegmentBytes: a store's own segment size takes effect from the
// next append (entries of 1041 bytes with their framing, a new segment
// once one holds 3000: three entries per file), and 0 goes back to the
// default (the last file takes all the rest).
func TestSetSegmentBytes(t *testing.T) {
	dir := t.TempDir()
	s := openTestLogStore(t, dir)
	s.SetSegmentBytes(3000)
	for i := uint64(1); i <= 16; i++ {
		l := &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(i)}, 1000)}
		if err := s.StoreLogs([]*raft.Log{l}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(segmentFiles(t, dir)); n != 6 {
		t.Errorf("%d segment files for 16 entries of 1 KB in segments past 3 KB, want 6", n)
	}
	s.SetSegmentBytes(0)
	for i := uint64(17); i <= 40; i++ {
		l := &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(i)}, 1000)}
		if err := s.StoreLogs([]*raft.Log{l}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(segmentFiles(t, dir)); n != 6 {
		t.Errorf("%d segment files after going back to the default size, want 6", n)
	}
}

// TestInUse: a directory without a log, or with a closed one, is free; an
// open Store's is in use.
func TestInUse(t *testing.T) {
	dir := t.TempDir()
	if err := InUse(dir); err != nil {
		t.Fatalf("no log: %v", err)
	}
	s := openTestLogStore(t, dir)
	if err := InUse(dir); !errors.Is(err, ErrInUse) {
		t.Fatalf("open store: %v, want ErrInUse", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := InUse(dir); err != nil {
		t.Fatalf("closed store: %v", err)
	}
}

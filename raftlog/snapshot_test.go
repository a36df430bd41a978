package raftlog

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

var testConfiguration = raft.Configuration{Servers: []raft.Server{{ID: "a", Address: "127.0.0.1:1"}}}

// writeSnapshot writes one snapshot of state at index and term to s.
func writeSnapshot(t *testing.T, s raft.SnapshotStore, index, term uint64, state []byte) string {
	t.Helper()
	_, trans := raft.NewInmemTransport("127.0.0.1:1")
	sink, err := s.Create(1, index, term, testConfiguration, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	for b := state; len(b) > 0; b = b[min(len(b), 1000):] { // several writes
		if _, err := sink.Write(b[:min(len(b), 1000)]); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	return sink.ID()
}

func readSnapshot(t *testing.T, s raft.SnapshotStore, id string) (*raft.SnapshotMeta, []byte) {
	t.Helper()
	m, rc, err := s.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return m, b
}

func stateOf(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// TestSnapshotRoundTrip: a closed snapshot lists with its meta and opens to
// the bytes written; only the newest retain are kept, newest first.
func TestSnapshotRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenSnapshots(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{
		writeSnapshot(t, s, 10, 1, stateOf(5000, 1)),
		writeSnapshot(t, s, 20, 1, stateOf(3000, 2)),
		writeSnapshot(t, s, 15, 2, stateOf(0, 3)), // a later term, an earlier index: newer
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != ids[2] || list[1].ID != ids[1] {
		t.Fatalf("List = %v, want [%s %s]", list, ids[2], ids[1])
	}
	if _, err := os.Stat(filepath.Join(dir, snapshotsDir, ids[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the oldest snapshot was not reaped: %v", err)
	}
	m, b := readSnapshot(t, s, ids[1])
	if !bytes.Equal(b, stateOf(3000, 2)) || m.Index != 20 || m.Term != 1 || m.Size != 3000 || m.ConfigurationIndex != 1 ||
		len(m.Configuration.Servers) != 1 || m.Configuration.Servers[0].ID != "a" {
		t.Errorf("snapshot %s: meta %+v, %d bytes", ids[1], m, len(b))
	}
	if _, b := readSnapshot(t, s, ids[2]); len(b) != 0 {
		t.Errorf("empty snapshot read back %d bytes", len(b))
	}
}

// TestSnapshotDamageRefused: a flipped byte, a truncated state, a meta.json
// without a checksum, or a bad ID is an error at Open, never a restore.
func TestSnapshotDamageRefused(t *testing.T) {
	for name, damage := range map[string]func(dir string){
		"flipped byte": func(dir string) {
			p := filepath.Join(dir, stateFile)
			b, _ := os.ReadFile(p)
			b[1234] ^= 0x10
			os.WriteFile(p, b, 0o644)
		},
		"truncated": func(dir string) { os.Truncate(filepath.Join(dir, stateFile), 4000) },
		"no checksum": func(dir string) {
			p := filepath.Join(dir, metaFile)
			b, _ := os.ReadFile(p)
			i := bytes.Index(b, []byte(`,"CRC32C"`))
			os.WriteFile(p, append(b[:i:i], '}'), 0o644)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := OpenSnapshots(t.TempDir(), 1)
			if err != nil {
				t.Fatal(err)
			}
			id := writeSnapshot(t, s, 3, 1, stateOf(5000, 9))
			damage(filepath.Join(s.dir, id))
			if _, _, err := s.Open(id); !errors.Is(err, ErrSnapshotCorrupt) {
				t.Fatalf("Open after damage: %v, want ErrSnapshotCorrupt", err)
			}
		})
	}
	s, err := OpenSnapshots(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", ".", "..", "../x", "1-2-3.tmp", "a/b"} {
		if _, _, err := s.Open(id); err == nil {
			t.Errorf("Open(%q) succeeded", id)
		}
	}
}

// TestSnapshotCancelAndCrash: a cancelled snapshot leaves nothing; an
// unfinished one (a crash before Close) is not listed, and the next
// OpenSnapshots removes it.
func TestSnapshotCancelAndCrash(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenSnapshots(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := s.Create(1, 5, 1, testConfiguration, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink.Write([]byte("abc"))
	if err := sink.Cancel(); err != nil {
		t.Fatal(err)
	}
	crashed, err := s.Create(1, 6, 1, testConfiguration, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	crashed.Write([]byte("abc")) // never closed
	list, err := s.List()
	if err != nil || len(list) != 0 {
		t.Fatalf("List = %v, %v; want nothing", list, err)
	}
	if _, err := OpenSnapshots(dir, 1); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, snapshotsDir))
	for _, e := range ents {
		t.Errorf("left in snapshots/: %s", e.Name())
	}
	if _, err := s.Create(2, 1, 1, testConfiguration, 1, nil); err == nil {
		t.Error("Create of snapshot version 2 succeeded")
	}
	if _, err := OpenSnapshots(dir, 0); err == nil {
		t.Error("OpenSnapshots retaining 0 succeeded")
	}
}

// TestSnapshotReadsFileSnapshotStore: a data dir whose snapshots
// raft.FileSnapshotStore wrote (CRC64) opens here, and a damaged one is
// refused; this store's own snapshots list beside them in one order.
func TestSnapshotReadsFileSnapshotStore(t *testing.T) {
	dir := t.TempDir()
	old, err := raft.NewFileSnapshotStoreWithLogger(dir, 3, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	idOld := writeSnapshot(t, old, 10, 1, stateOf(7000, 4))
	s, err := OpenSnapshots(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if m, b := readSnapshot(t, s, idOld); !bytes.Equal(b, stateOf(7000, 4)) || m.Index != 10 {
		t.Fatalf("FileSnapshotStore's snapshot read back as %+v, %d bytes", m, len(b))
	}
	idNew := writeSnapshot(t, s, 11, 1, stateOf(100, 5))
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].ID != idNew || list[1].ID != idOld {
		t.Fatalf("List = %v, %v", list, err)
	}
	p := filepath.Join(dir, snapshotsDir, idOld, stateFile)
	b, _ := os.ReadFile(p)
	b[10] ^= 1
	os.WriteFile(p, b, 0o644)
	if _, _, err := s.Open(idOld); !errors.Is(err, ErrSnapshotCorrupt) || !strings.Contains(err.Error(), "CRC64") {
		t.Errorf("damaged FileSnapshotStore snapshot: %v", err)
	}
}

// BenchmarkSnapshotStores writes, opens and reads back a 64 MiB snapshot
// (the size of θ, m and v at 5.6M parameters) with raft.FileSnapshotStore
// (CRC64) and with SnapshotStore (CRC32C): one op is one snapshot taken
// and restored.
func BenchmarkSnapshotStores(b *testing.B) {
	state := stateOf(64<<20, 1)
	for _, tc := range []struct {
		name string
		open func(dir string) (raft.SnapshotStore, error)
	}{
		{"raft.FileSnapshotStore", func(dir string) (raft.SnapshotStore, error) {
			return raft.NewFileSnapshotStoreWithLogger(dir, 1, hclog.NewNullLogger())
		}},
		{"SnapshotStore", func(dir string) (raft.SnapshotStore, error) { return OpenSnapshots(dir, 1) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := tc.open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			_, trans := raft.NewInmemTransport("127.0.0.1:1")
			b.SetBytes(int64(len(state)))
			for i := 0; b.Loop(); i++ {
				sink, err := s.Create(1, uint64(i+1), 1, testConfiguration, 1, trans)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := sink.Write(state); err != nil {
					b.Fatal(err)
				}
				if err := sink.Close(); err != nil {
					b.Fatal(err)
				}
				_, rc, err := s.Open(sink.ID())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, rc); err != nil {
					b.Fatal(err)
				}
				rc.Close()
			}
		})
	}
}

// TestReadSnapshots: the read-only store lists every complete snapshot,
// newest first, beyond the writer's retain bound, opens them with their
// checksum checked, leaves an unfinished (.tmp) one in place, refuses
// Create, and is nil without a snapshot directory.
func TestReadSnapshots(t *testing.T) {
	base := t.TempDir()
	if s, err := ReadSnapshots(base); s != nil || err != nil {
		t.Fatalf("no snapshot directory: %v, %v; want nil, nil", s, err)
	}
	w, err := OpenSnapshots(base, 5)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		ids = append(ids, writeSnapshot(t, w, uint64(10*(i+1)), 2, stateOf(1000, byte(i))))
	}
	tmp := filepath.Join(base, snapshotsDir, "2-99-1"+tmpSuffix)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := ReadSnapshots(base)
	if err != nil || r == nil {
		t.Fatalf("ReadSnapshots: %v, %v", r, err)
	}
	metas, err := r.List()
	if err != nil || len(metas) != 3 || metas[0].ID != ids[2] || metas[2].ID != ids[0] {
		t.Fatalf("List = %v, %v; want the three, newest first", metas, err)
	}
	if _, got := readSnapshot(t, r, ids[1]); !bytes.Equal(got, stateOf(1000, 1)) {
		t.Error("the read-only store read another state")
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Errorf("the unfinished snapshot was touched: %v", err)
	}
	if _, err := r.Create(1, 40, 2, raft.Configuration{}, 1, nil); err == nil {
		t.Error("Create on a read-only store succeeded")
	}
}

package coordinator

import (
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/raftlog"
)

// TestDataDirBelongsToOneReplica is issue 27's finding 6: a replica
// started with another replica's data dir (--id r2 on r3's dir) ran with
// no warning. The replica's ID is written in the data dir when it is
// first opened; another ID is refused before anything in the dir is read
// or written, with an error naming both IDs, and the owner still opens it.
func TestDataDirBelongsToOneReplica(t *testing.T) {
	dir := t.TempDir()
	cfg := testReplicaConfig(dir, freeAddr(t))
	r, err := OpenReplica(cfg, testInit)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if b, err := os.ReadFile(filepath.Join(dir, ReplicaIDFile)); err != nil || string(b) != "r1\n" {
		t.Fatalf("%s = %q, %v; want r1", ReplicaIDFile, b, err)
	}
	before := dirState(t, dir)

	other := cfg
	other.ID = "r2"
	r, err = OpenReplica(other, testInit)
	if err == nil {
		r.Close()
		t.Fatal("replica r2 opened r1's data dir")
	}
	if !errors.Is(err, ErrDataDirOwner) || !strings.Contains(err.Error(), `belongs to replica "r1"`) || !strings.Contains(err.Error(), `"r2"`) {
		t.Fatalf("OpenReplica as r2 = %v, want ErrDataDirOwner naming r1 and r2", err)
	}
	if after := dirState(t, dir); !maps.Equal(after, before) {
		t.Errorf("the refused start changed the data dir:\n%v\nthen\n%v", before, after)
	}
	if r, err = OpenReplica(cfg, testInit); err != nil {
		t.Fatalf("r1 reopening its own dir: %v", err)
	}
	r.Close()
}

// TestDataDirClaimWarnsOnlyOnReplicaState: a data dir is claimed without a
// warning when it holds no replica state yet (a fresh dir, or one holding
// only the calibration `local` and `serve` write before the replica
// opens); a dir with a ledger or a Raft log and no ID (written before IDs
// were recorded) is claimed with one. Every fresh `local` run warned.
func TestDataDirClaimWarnsOnlyOnReplicaState(t *testing.T) {
	for _, c := range []struct {
		name  string
		files []string
		warn  bool
	}{
		{"fresh", nil, false},
		{"calibration only", []string{CalibrationFile}, false},
		{"a ledger", []string{CalibrationFile, LedgerFile}, true},
		{"a Raft log", []string{"raft/"}, true},
	} {
		dir := t.TempDir()
		for _, f := range c.files {
			p := filepath.Join(dir, f)
			var err error
			if strings.HasSuffix(f, "/") {
				err = os.MkdirAll(p, 0o755)
			} else {
				err = os.WriteFile(p, []byte("x"), 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		var logs strings.Builder
		log := slog.New(slog.NewTextHandler(&logs, nil))
		if err := claimDataDir(dir, "r1", log); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if warned := strings.Contains(logs.String(), "level=WARN"); warned != c.warn {
			t.Errorf("%s: warned %v, want %v:\n%s", c.name, warned, c.warn, logs.String())
		}
	}
}

// TestHasRaftState: a new data dir, or one a replica opened without
// bootstrapping (it wrote its ID and an empty log), holds no Raft state;
// one a replica bootstrapped does, and so does one holding only a
// snapshot.
func TestHasRaftState(t *testing.T) {
	has := func(dir string) bool {
		t.Helper()
		got, err := HasRaftState(dir)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if has(t.TempDir()) {
		t.Error("a new data dir holds Raft state")
	}
	idle := t.TempDir()
	cfg := testReplicaConfig(idle, freeAddr(t))
	cfg.Bootstrap = false
	r, err := OpenReplica(cfg, testInit)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if has(idle) {
		t.Error("a data dir opened without bootstrap holds Raft state")
	}
	boot := t.TempDir()
	r = openTestReplica(t, boot, freeAddr(t))
	r.Close()
	if !has(boot) {
		t.Error("a bootstrapped data dir holds no Raft state")
	}
	snapOnly := t.TempDir()
	snaps, err := raftlog.OpenSnapshots(snapOnly, 1)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := snaps.Create(1, 5, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if !has(snapOnly) {
		t.Error("a data dir with a snapshot holds no Raft state")
	}
}

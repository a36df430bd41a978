package coordinator

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/internal/durable"
	"github.com/dpcluster/dpcluster/raftlog"
)

// ReplicaIDFile, in a replica's data dir, names the replica the dir
// belongs to: written (durably) when the dir is first opened, checked on
// every later open.
const ReplicaIDFile = "replica-id"

// ErrDataDirOwner is returned (wrapped, naming both IDs) by OpenReplica
// for a data dir that belongs to another replica.
var ErrDataDirOwner = errors.New("coordinator: the data dir belongs to another replica")

// CheckDataDirOwner reads dir's ReplicaIDFile, if any: claimed says the
// dir names its replica, and the error (wrapping ErrDataDirOwner) that it
// is not id. It writes nothing, so a command can refuse a wrong dir before
// it loads anything; OpenReplica checks again.
func CheckDataDirOwner(dir, id string) (claimed bool, err error) {
	path := filepath.Join(dir, ReplicaIDFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("coordinator: reading %s: %w", path, err)
	}
	if owner := strings.TrimSpace(string(b)); owner != id {
		return true, fmt.Errorf("%w: %s belongs to replica %q (its %s), not %q: give each replica its own --data-dir",
			ErrDataDirOwner, dir, owner, ReplicaIDFile, id)
	}
	return true, nil
}

// claimDataDir makes dir the data dir of replica id: it refuses a dir whose
// ReplicaIDFile names another replica, before anything in it is read or
// written (a replica started on another's dir would take its Raft
// identity's place with that replica's log and ledger: two voters claiming
// one history). A dir without the file is claimed: a new one, or one
// written before the file existed (then, if it holds a ledger or a Raft
// log, the claim is logged as a warning).
func claimDataDir(dir, id string, log *slog.Logger) error {
	claimed, err := CheckDataDirOwner(dir, id)
	if err != nil || claimed {
		return err
	}
	path := filepath.Join(dir, ReplicaIDFile)
	// Replica state without an ID: a ledger or a Raft log (not the
	// calibration, which the commands write before the replica opens).
	var state bool
	for _, name := range []string{LedgerFile, "raft"} {
		_, err := os.Stat(filepath.Join(dir, name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("coordinator: %w", err)
		}
		state = state || err == nil
	}
	if state {
		log.Warn("data dir has no replica ID (written before they were recorded): claiming it for this replica", "data_dir", dir, "file", ReplicaIDFile)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	err = durable.Create(path, 0o644, func(f *os.File) error {
		_, err := fmt.Fprintln(f, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("coordinator: recording the replica ID in %s: %w", path, err)
	}
	return nil
}

// HasRaftState reports whether the replica data dir dir holds Raft state:
// a log with an entry or a term (raftlog.Store, in raft/; a bbolt log of
// an earlier version counts), or a snapshot. A replica without any has no
// configuration and so no peers to elect itself among: it must bootstrap
// a cluster or be added to one. It reads only, without the log's lock, so
// a command can ask before it loads anything.
func HasRaftState(dir string) (bool, error) {
	raftDir := filepath.Join(dir, "raft")
	if _, err := os.Stat(filepath.Join(raftDir, "log.db")); err == nil {
		return true, nil
	}
	snaps, err := raftlog.ReadSnapshots(dir)
	if err != nil {
		return false, err
	}
	var store raft.SnapshotStore = emptySnapshots{}
	if snaps != nil {
		store = snaps
	}
	logs, err := raftlog.OpenReadOnly(raftDir)
	if errors.Is(err, raftlog.ErrNoLog) {
		list, err := store.List()
		return len(list) > 0, err
	}
	if err != nil {
		return false, err
	}
	defer logs.Close()
	return raft.HasExistingState(logs, logs, store)
}

// emptySnapshots stands for a data dir without a snapshot directory:
// raft.HasExistingState calls only List.
type emptySnapshots struct{ raft.SnapshotStore }

func (emptySnapshots) List() ([]*raft.SnapshotMeta, error) { return nil, nil }

package coordinator

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/ledger"
)

// A Raft history is one Raft log from its first entry on. The ledger
// deduplicates charges by Raft index, and indexes start again from 1 in a
// log rebuilt from nothing, so every history gets an ID (see
// ledger.Position): the leader that first proposes the run configuration
// draws it (newHistoryID) and the configuration entry carries it to every
// replica, whose ledger records it in its run record and on every charge.
// Before Raft starts, OpenReplica reads what the Raft state on disk holds
// (readRaftState) and lets the ledger decide whether it may resume on it
// (ledger.CheckRaftState).

// newHistoryID returns a fresh history ID: 128 random bits from the OS
// CSPRNG, in hex. Two histories share an ID with probability about
// n²/2^129 for n histories, negligible.
func newHistoryID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("coordinator: drawing a history ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// readRaftState describes the Raft state in logs and snaps for
// ledger.CheckRaftState: the last index either holds, and the history ID
// of the run configuration, taken from the newest snapshot that decodes
// if it is configured (as Raft restores the newest snapshot that opens),
// else from the first configuration entry in the log. It reads only; it
// must run before Raft starts on these stores.
func readRaftState(logs raft.LogStore, snaps raft.SnapshotStore) (ledger.RaftState, error) {
	var st ledger.RaftState
	metas, err := snaps.List()
	if err != nil {
		return st, fmt.Errorf("coordinator: listing snapshots: %w", err)
	}
	var snapErr error
	for _, m := range metas {
		body, err := readSnapshotBody(snaps, m.ID)
		if err != nil {
			snapErr = errors.Join(snapErr, err)
			continue // Raft, too, falls back to an older snapshot
		}
		st.LastIndex = m.Index
		st.Configured, st.History = body.Configured, body.History
		snapErr = nil
		break
	}
	if snapErr != nil {
		return st, fmt.Errorf("coordinator: no snapshot decodes: %w", snapErr)
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return st, fmt.Errorf("coordinator: reading the Raft log: %w", err)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return st, fmt.Errorf("coordinator: reading the Raft log: %w", err)
	}
	st.LastIndex = max(st.LastIndex, last)
	for i := first; !st.Configured && first > 0 && i <= last; i++ {
		var e raft.Log
		if err := logs.GetLog(i, &e); err != nil {
			return st, fmt.Errorf("coordinator: reading Raft log entry %d: %w", i, err)
		}
		if e.Type != raft.LogCommand {
			continue
		}
		// An entry that does not decode is left to the state machine,
		// which fails on it when Raft applies it.
		if t, body, err := decodeEntry(e.Data); err == nil && t == entryConfig {
			if c, err := decodeConfig(body); err == nil {
				st.Configured, st.History = true, c.History
			}
		}
	}
	return st, nil
}

// readSnapshotBody opens snapshot id and decodes its body.
func readSnapshotBody(snaps raft.SnapshotStore, id string) (snapshotBody, error) {
	_, rc, err := snaps.Open(id)
	if err != nil {
		return snapshotBody{}, fmt.Errorf("coordinator: opening snapshot %s: %w", id, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return snapshotBody{}, fmt.Errorf("coordinator: reading snapshot %s: %w", id, err)
	}
	snap, err := decodeSnapshot(data)
	if err != nil {
		return snapshotBody{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return snap.Body, nil
}

package raftlog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Held reports whether a process holds the log in dir open for writing
// now (its LOCK, which Open takes for as long as the store is open): false
// when no one does or dir holds no log. Unlike InUse it takes nothing and
// opens nothing for writing where the kernel lists its locks (Linux's
// /proc/locks): a reader beside a running replica (an audit of its ledger)
// must neither change its files nor make it wait. Elsewhere it falls back
// to a non-blocking shared-lock probe, released at once, which holds the
// lock for an instant only when no process holds it (a replica starting
// at that instant retries, as Open does).
func Held(dir string) (bool, error) {
	path := filepath.Join(dir, lockFile)
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("raftlog: Raft log lock: %w", err)
	}
	if held, listed := lockListed(st); listed {
		return held, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("raftlog: Raft log lock: %w", err)
	}
	defer f.Close()
	switch err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("raftlog: Raft log lock: %w", err)
	}
	return false, syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}

package raftlog

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestHeldReadsTheLockTable: on Linux Held answers from /proc/locks, not
// by taking the lock: a table that lists a flock on the LOCK file says
// held though no process holds it. It probes the lock instead when the
// table cannot say: none, or a flock on the same inode number on another
// device (btrfs and overlayfs list other device numbers than stat's).
func TestHeldReadsTheLockTable(t *testing.T) {
	dir := t.TempDir()
	openTestLogStore(t, dir).Close()
	st, err := os.Stat(filepath.Join(dir, lockFile))
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	dev := uint64(sys.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^uint64(0xfff)
	minor := dev&0xff | (dev>>12)&^uint64(0xff)
	table := filepath.Join(t.TempDir(), "locks")
	old := procLocks
	t.Cleanup(func() { procLocks = old })
	procLocks = table
	for _, tc := range []struct {
		name, table string
		want        bool
	}{
		{"listed", fmt.Sprintf("1: POSIX  ADVISORY  WRITE 7 00:05:1 0 EOF\n2: FLOCK  ADVISORY  WRITE 42 %02x:%02x:%d 0 EOF\n", major, minor, sys.Ino), true},
		{"only a waiter", fmt.Sprintf("1: -> FLOCK  ADVISORY  WRITE 42 %02x:%02x:%d 0 EOF\n", major, minor, sys.Ino), false},
		{"another file", fmt.Sprintf("1: FLOCK  ADVISORY  WRITE 42 %02x:%02x:%d 0 EOF\n", major, minor, sys.Ino+1), false},
		{"same inode, other device: probed", fmt.Sprintf("1: FLOCK  ADVISORY  WRITE 42 %02x:%02x:%d 0 EOF\n", major+1, minor, sys.Ino), false},
		{"no table: probed", "", false},
	} {
		if tc.table == "" {
			os.Remove(table)
		} else if err := os.WriteFile(table, []byte(tc.table), 0o644); err != nil {
			t.Fatal(err)
		}
		if held, err := Held(dir); err != nil || held != tc.want {
			t.Errorf("%s: held %v, %v; want %v", tc.name, held, err, tc.want)
		}
	}
	// Probed, the lock is found held when it is.
	s := openTestLogStore(t, dir)
	defer s.Close()
	if held, err := Held(dir); err != nil || !held {
		t.Errorf("no table, open store: held %v, %v", held, err)
	}
}

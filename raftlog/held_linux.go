package raftlog

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// procLocks is the kernel's table of file locks (proc(5)); a variable for
// the tests.
var procLocks = "/proc/locks"

// lockListed looks up the file st (the log's LOCK) in the kernel's lock
// table: held says a process holds a flock on it. listed is false when the
// table cannot say, and Held must ask another way: the table cannot be
// read (no /proc), or it lists a flock on a file of the same inode number
// on another device, which may be this one (on btrfs and overlayfs the
// table's device numbers can differ from stat's).
//
// Each line of the table is one lock, for example
//
//	1: FLOCK  ADVISORY  WRITE 12377 fe:00:9986038 0 EOF
//	1: -> FLOCK  ADVISORY  WRITE 12380 fe:00:9986038 0 EOF
//
// (a lock held, then a process waiting for it): the kind, the mode, the
// owner's PID and the file as MAJOR:MINOR:INODE, the device numbers in hex.
func lockListed(st fs.FileInfo) (held, listed bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return false, false
	}
	table, err := os.ReadFile(procLocks)
	if err != nil {
		return false, false
	}
	dev := uint64(sys.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^uint64(0xfff)
	minor := dev&0xff | (dev>>12)&^uint64(0xff)
	want := fmt.Sprintf("%02x:%02x:%d", major, minor, sys.Ino)
	ino := fmt.Sprintf(":%d", sys.Ino)
	listed = true
	sc := bufio.NewScanner(bytes.NewReader(table))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 6 || string(f[1]) != "FLOCK" {
			continue // another kind of lock, or a process waiting ("->")
		}
		switch file := string(f[5]); {
		case file == want:
			return true, true
		case bytes.HasSuffix(f[5], []byte(ino)):
			listed = false
		}
	}
	return false, listed
}

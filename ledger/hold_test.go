package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// heldLedger opens a ledger whose fsyncs are counted, and fail when *fail
// is set; it starts a run (one fsync).
func heldLedger(t *testing.T, syncs *int, fail *bool) (*Ledger, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := Open(path, WithSyncHook(func(fh *os.File) error {
		*syncs++
		if *fail {
			return syscall.EIO
		}
		return fh.Sync()
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := l.Start("test-run", 100, 1e-5, seed.Crypto, MechanismFloat, "", testHistory); err != nil {
		t.Fatal(err)
	}
	return l, path
}

// TestHoldFlushOneFsync: charges appended while held cost one fsync, at
// Flush; Size counts only what is durable until then; the file then holds
// every record and audits.
func TestHoldFlushOneFsync(t *testing.T) {
	var syncs int
	var fail bool
	l, path := heldLedger(t, &syncs, &fail)
	start, size := syncs, l.Size()
	e := accounting.SubsampledGaussian(testQ, testSigma)
	l.Hold()
	for i := range 10 {
		if _, err := l.Charge(int64(i+1), e, at(1, uint64(i+2)), false); err != nil {
			t.Fatal(err)
		}
	}
	if syncs != start || l.Size() != size {
		t.Errorf("while held: %d fsyncs, Size %d (want %d, %d)", syncs-start, l.Size(), 0, size)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if syncs != start+1 || l.Size() <= size {
		t.Errorf("after Flush: %d fsyncs (want 1), Size %d (was %d)", syncs-start, l.Size(), size)
	}
	if err := l.Flush(); err != nil || syncs != start+1 {
		t.Errorf("a second Flush with nothing held: %v, %d fsyncs", err, syncs-start)
	}
	// Not held any more: each charge is fsynced at once.
	if _, err := l.Charge(11, e, at(1, 12), false); err != nil || syncs != start+2 {
		t.Errorf("charge after Flush: %v, %d fsyncs (want 2)", err, syncs-start)
	}
	rep, err := Audit(path)
	if err != nil || !rep.OK || rep.Charges != 11 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

// TestHoldFailedFlushKeepsDurablePrefix: a failed fsync at Flush cuts the
// held records off the file, breaks the ledger (every later charge fails),
// and the file reopens with the charges fsynced before the hold only.
func TestHoldFailedFlushKeepsDurablePrefix(t *testing.T) {
	var syncs int
	var fail bool
	l, path := heldLedger(t, &syncs, &fail)
	e := accounting.SubsampledGaussian(testQ, testSigma)
	if _, err := l.Charge(1, e, at(1, 2), false); err != nil {
		t.Fatal(err)
	}
	size := l.Size()
	l.Hold()
	for i := 2; i <= 4; i++ {
		if _, err := l.Charge(int64(i), e, at(1, uint64(i+1)), false); err != nil {
			t.Fatal(err)
		}
	}
	fail = true
	if err := l.Flush(); !errors.Is(err, ErrBroken) {
		t.Fatalf("Flush with a failing fsync: %v, want ErrBroken", err)
	}
	fail = false
	if _, err := l.Charge(5, e, at(1, 6), false); !errors.Is(err, ErrBroken) {
		t.Errorf("charge after the failed Flush: %v, want ErrBroken", err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != size {
		t.Errorf("file after the failed Flush: %v bytes, %v; want the durable %d", st.Size(), err, size)
	}
	l.Close()
	rep, err := Audit(path)
	if err != nil || !rep.OK || rep.Charges != 1 {
		t.Errorf("audit of the durable prefix: %+v, %v", rep, err)
	}
}

// TestCloseFlushesHeldRecords: closing a held ledger fsyncs what it holds.
func TestCloseFlushesHeldRecords(t *testing.T) {
	var syncs int
	var fail bool
	l, path := heldLedger(t, &syncs, &fail)
	e := accounting.SubsampledGaussian(testQ, testSigma)
	l.Hold()
	if _, err := l.Charge(1, e, at(1, 2), false); err != nil {
		t.Fatal(err)
	}
	before := syncs
	if err := l.Close(); err != nil || syncs != before+1 {
		t.Errorf("Close: %v, %d fsyncs (want 1)", err, syncs-before)
	}
	if rep, err := Audit(path); err != nil || !rep.OK || rep.Charges != 1 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
}

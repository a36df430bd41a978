package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

const (
	testQ       = 0.01
	testSigma   = 1.0
	testHistory = "0123456789abcdef0123456789abcdef"
)

// at is the position of a charge in the test history.
func at(term, index uint64) Position {
	return Position{History: testHistory, Term: term, Index: index}
}

// newLedger opens a ledger in a temp dir and starts a run.
func newLedger(t *testing.T, target float64) (*Ledger, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := l.Start("test-run", target, 1e-5, seed.Crypto, MechanismFloat, "", testHistory); err != nil {
		t.Fatal(err)
	}
	return l, path
}

func chargeSteps(t *testing.T, l *Ledger, from, to int64) {
	t.Helper()
	for s := from; s <= to; s++ {
		if _, err := l.Charge(s, accounting.SubsampledGaussian(testQ, testSigma), at(1, uint64(s+10)), false); err != nil {
			t.Fatalf("Charge(step %d): %v", s, err)
		}
	}
}

func TestLedgerReopen(t *testing.T) {
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 20)
	spent := l.Spent()
	head, n := l.Head()
	l.Close()

	l2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if got := l2.Spent(); got != spent {
		t.Errorf("Spent after reopen = %v, want %v", got, spent)
	}
	if h2, n2 := l2.Head(); h2.Hash != head.Hash || n2 != n {
		t.Errorf("Head after reopen = (%s, %d), want (%s, %d)", h2.Hash, n2, head.Hash, n)
	}
	if got, want := l2.LastIndex(), uint64(30); got != want {
		t.Errorf("LastIndex = %d, want %d", got, want)
	}
	if err := l2.Start("test-run", 10, 1e-5, seed.Crypto, MechanismFloat, "", testHistory); err != nil {
		t.Errorf("Start with the same run: %v", err)
	}
	if err := l2.Start("other-run", 10, 1e-5, seed.Crypto, MechanismFloat, "", testHistory); !errors.Is(err, ErrRunMismatch) {
		t.Errorf("Start with another run: %v, want ErrRunMismatch", err)
	}
	// ε recorded in the head equals what a fresh accountant computes.
	want, _, _ := accounting.RDP{}.EpsilonOrder(accounting.SubsampledGaussian(testQ, testSigma), 20, 1e-5)
	if d := head.Epsilon - want; d > 1e-12 || d < -1e-12 {
		t.Errorf("head ε = %v, fresh accountant %v", head.Epsilon, want)
	}
	rep, err := Audit(path)
	if err != nil || !rep.OK {
		t.Fatalf("Audit = %+v, %v", rep, err)
	}
	// Without an end record, the last step charged may have been charged
	// ahead of its g̃: the ledger alone cannot confirm it was applied.
	if rep.Charges != 20 || rep.Applied != 19 || rep.Unconfirmed != 1 || rep.LastStep != 20 {
		t.Errorf("audit counts = %+v", rep)
	}
}

func TestLedgerBudgetRefusal(t *testing.T) {
	target, _, _ := accounting.RDP{}.EpsilonOrder(accounting.SubsampledGaussian(testQ, testSigma), 5, 1e-5)
	target *= 1.0000001 // room for exactly 5 steps
	l, path := newLedger(t, target)
	chargeSteps(t, l, 1, 5)
	before, nBefore := l.Head()
	spent := l.Spent()
	_, err := l.Charge(6, accounting.SubsampledGaussian(testQ, testSigma), at(1, 16), false)
	if !errors.Is(err, ErrBudgetExceeded) {
		t.Fatalf("6th charge: %v, want ErrBudgetExceeded", err)
	}
	if after, n := l.Head(); after.Hash != before.Hash || n != nBefore {
		t.Errorf("refused charge changed the file: head %d→%d", nBefore, n)
	}
	if l.Spent() != spent {
		t.Errorf("refused charge changed Spent: %v → %v", spent, l.Spent())
	}
	if over, _ := l.WouldExceed(accounting.SubsampledGaussian(testQ, testSigma)); !over {
		t.Error("WouldExceed = false after the budget ran out")
	}
	if rep, _ := Audit(path); !rep.OK || rep.Charges != 5 {
		t.Errorf("audit after refusal: %+v", rep)
	}
}

func TestLedgerTornTailRepaired(t *testing.T) {
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 10)
	l.Close()
	full, _ := os.ReadFile(path)
	// Cut the last record short at several points: in its header, in its
	// payload, one byte before its end.
	recs, _, _ := ReadFile(path)
	lastLen := len(full) - frameLen(t, full, len(recs)-1)
	for _, cut := range []int{1, 5, frameHeader + 3, lastLen - 1} {
		if err := os.WriteFile(path, full[:len(full)-cut], 0o644); err != nil {
			t.Fatal(err)
		}
		// A torn tail fails the audit (the file may have been cut), unless
		// a replica runs on the ledger: then it is an append in progress.
		rep, err := Audit(path)
		if err != nil || rep.OK || rep.TornBytes == 0 || rep.Charges != 9 || len(rep.Problems) != 1 || !strings.HasPrefix(rep.Problems[0], "torn tail") {
			t.Fatalf("cut %d: audit of torn file = %+v, %v", cut, rep, err)
		}
		c, err := ReadContents(path)
		if err != nil {
			t.Fatal(err)
		}
		if rep := c.Audit(AuditOptions{Live: true}); !rep.OK || !rep.Live || rep.TornBytes != int64(lastLen-cut) || rep.Charges != 9 {
			t.Fatalf("cut %d: audit of a live ledger's torn tail = %+v", cut, rep)
		}
		l2, err := Open(path)
		if err != nil {
			t.Fatalf("cut %d: Open: %v", cut, err)
		}
		if _, n := l2.Head(); n != 10 {
			t.Errorf("cut %d: %d records after repair, want 10 (run + 9 charges)", cut, n)
		}
		// The repaired ledger takes new charges and audits clean.
		if _, err := l2.Charge(10, accounting.SubsampledGaussian(testQ, testSigma), at(2, 20), false); err != nil {
			t.Fatalf("cut %d: charge after repair: %v", cut, err)
		}
		l2.Close()
		if rep, _ := Audit(path); !rep.OK || rep.TornBytes != 0 || rep.Charges != 10 {
			t.Errorf("cut %d: audit after repair = %+v", cut, rep)
		}
	}
	// A zero-filled tail (preallocated blocks) is also torn.
	if err := os.WriteFile(path, append(full, make([]byte, 4096)...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, repaired, err := OpenFile(path); err != nil || repaired != 4096 {
		t.Errorf("zero tail: repaired %d, err %v", repaired, err)
	}
}

// frameLen returns the offset of record i (0-based) in a ledger file.
func frameLen(t *testing.T, b []byte, i int) int {
	t.Helper()
	off := 0
	for range i {
		n := int(b[off]) | int(b[off+1])<<8 | int(b[off+2])<<16 | int(b[off+3])<<24
		off += frameHeader + n
	}
	return off
}

func TestLedgerCorruptionDetected(t *testing.T) {
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 10)
	l.Close()
	full, _ := os.ReadFile(path)
	mid := frameLen(t, full, 5) + frameHeader + 10 // inside record 6's payload
	for _, tc := range []struct {
		name   string
		mutate func([]byte) []byte
	}{
		{"flipped payload byte", func(b []byte) []byte { b[mid] ^= 0x01; return b }},
		{"flipped CRC byte", func(b []byte) []byte { b[frameLen(t, b, 5)+5] ^= 0x80; return b }},
		{"huge length", func(b []byte) []byte { b[frameLen(t, b, 3)+3] = 0x7f; return b }},
		// A length grown past the end of the file, but under
		// maxRecordSize, must not pass for a torn tail: that would drop
		// every record after it.
		{"length past end of file", func(b []byte) []byte { b[frameLen(t, b, 3)+2] ^= 0x01; return b }},
		{"record removed", func(b []byte) []byte {
			s, e := frameLen(t, b, 4), frameLen(t, b, 5)
			return append(b[:s:s], b[e:]...)
		}},
		{"garbage after zeros", func(b []byte) []byte { return append(append(b, make([]byte, 16)...), 'x') }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mutate(bytes.Clone(full))
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := Audit(path)
			if err != nil {
				t.Fatalf("Audit: %v", err)
			}
			if rep.OK {
				t.Errorf("audit passed a corrupted ledger: %+v", rep)
			}
			if _, err := Open(path); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Open = %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestLedgerRewrittenRecordCaught re-frames an edited record with a valid
// CRC: only the hash chain can catch it.
func TestLedgerRewrittenRecordCaught(t *testing.T) {
	l, path := newLedger(t, 10)
	chargeSteps(t, l, 1, 4)
	l.Close()
	recs, _, _ := ReadFile(path)
	recs[2].Epsilon /= 2 // under-report
	var buf bytes.Buffer
	for _, r := range recs {
		writeFrame(t, &buf, r)
	}
	os.WriteFile(path, buf.Bytes(), 0o644)
	rep, _ := Audit(path)
	if rep.OK || !strings.Contains(strings.Join(rep.Problems, ";"), "hash") {
		t.Errorf("edited record not caught by the hash chain: %+v", rep)
	}
}

// TestAuditRecomputesEpsilon writes a well-chained ledger whose recorded ε
// disagrees with its events, through File.Append directly.
func TestAuditRecomputesEpsilon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.log")
	f, _, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	e := accounting.SubsampledGaussian(testQ, testSigma)
	f.Append(Record{Kind: RecordRun, Run: "r", TargetEpsilon: 10, Delta: 1e-5})
	f.Append(Record{Kind: RecordCharge, Step: 1, Event: &e, Term: 1, Index: 3, Epsilon: 0.001})
	f.Close()
	rep, err := Audit(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !strings.Contains(strings.Join(rep.Problems, ";"), "recomputed") {
		t.Errorf("wrong ε not caught: %+v", rep)
	}
}

func TestAuditStepOrder(t *testing.T) {
	l, path := newLedger(t, 10)
	e := accounting.SubsampledGaussian(testQ, testSigma)
	mustCharge := func(step int64, index uint64, replay bool) {
		if _, err := l.Charge(step, e, at(1, index), replay); err != nil {
			t.Fatal(err)
		}
	}
	mustCharge(1, 3, false)
	mustCharge(2, 4, false)
	mustCharge(2, 5, true) // a late duplicate of step 2: charged, not applied
	mustCharge(3, 6, false)
	rep, _ := Audit(path)
	if !rep.OK || rep.Charges != 4 || rep.Replays != 1 || rep.Applied != 2 || rep.Unconfirmed != 1 {
		t.Fatalf("audit with a replay: %+v", rep)
	}
	// Step 4 charged ahead in term 1, its g̃ never committed; the term 2
	// leader charges it again: a recharge, not a problem.
	mustCharge(4, 7, false)
	if _, err := l.Charge(4, e, at(2, 8), false); err != nil {
		t.Fatal(err)
	}
	rep, _ = Audit(path)
	if !rep.OK || rep.Charges != 6 || rep.Recharges != 1 || rep.Applied != 3 || rep.Unconfirmed != 1 || rep.LastStep != 4 {
		t.Fatalf("audit with a recharge: %+v", rep)
	}
	if _, err := l.Charge(4, e, at(2, 9), false); err != nil { // step 4 applied twice in one term
		t.Fatal(err)
	}
	if rep, _ := Audit(path); rep.OK {
		t.Errorf("audit passed a step applied twice: %+v", rep)
	}
}

func TestLedgerFailClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(f *File)
	}{
		{"fsync error", func(f *File) { f.sync = func() error { return syscall.EIO } }},
		{"disk full", func(f *File) {
			f.sync = func() error { return nil }
			f.f.Close() // writes now fail
			ro, _ := os.Open(f.path)
			f.f = ro
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, path := newLedger(t, 10)
			chargeSteps(t, l, 1, 3)
			good, _ := l.Head()
			tc.fail(l.file)
			_, err := l.Charge(4, accounting.SubsampledGaussian(testQ, testSigma), at(1, 14), false)
			if !errors.Is(err, ErrBroken) {
				t.Fatalf("Charge after failure = %v, want ErrBroken", err)
			}
			l.file.sync = func() error { return nil }
			if _, err := l.Charge(5, accounting.SubsampledGaussian(testQ, testSigma), at(1, 15), false); !errors.Is(err, ErrBroken) {
				t.Errorf("ledger accepted a charge after a failed write: %v", err)
			}
			rep, _ := Audit(path)
			if !rep.OK || rep.Charges != 3 || rep.HeadHash != good.Hash {
				t.Errorf("file after failure: %+v", rep)
			}
		})
	}
}

// writeFrame frames r exactly as given, hash fields included, bypassing
// Append, with a valid CRC.
func writeFrame(t *testing.T, buf *bytes.Buffer, r Record) {
	t.Helper()
	payload, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, frameHeader)
	putFrameHeader(hdr, payload)
	buf.Write(hdr)
	buf.Write(payload)
}

func FuzzReadLedger(f *testing.F) {
	path := filepath.Join(f.TempDir(), "seed.log")
	l, err := Open(path)
	if err != nil {
		f.Fatal(err)
	}
	l.Start("fuzz", 10, 1e-5, seed.Crypto, MechanismFloat, "", testHistory)
	l.Charge(1, accounting.SubsampledGaussian(0.01, 1), at(1, 2), false)
	l.Charge(2, accounting.SubsampledGaussian(0.01, 1), at(1, 3), false)
	mid, _ := os.ReadFile(path)
	l.Charge(3, accounting.SubsampledGaussian(0.01, 1), at(1, 4), false)
	l.End(2, "privacy budget exhausted", at(2, 6))
	l.Charge(4, accounting.SubsampledGaussian(0.01, 1), at(2, 7), true)
	l.Close()
	seed, _ := os.ReadFile(path)
	f.Add(mid)
	f.Add(seed)
	f.Add(seed[:len(seed)-7])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, good, err := scan(bytes.NewReader(b))
		if good > int64(len(b)) {
			t.Fatalf("good offset %d past %d bytes", good, len(b))
		}
		if err == nil {
			if _, err := replay(recs); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("replay error is not ErrCorrupt: %v", err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("scan error is not ErrCorrupt: %v", err)
		}
	})
}

// TestRunRecordNoise: the run record names the noise source; a seeded run
// audits as not private; a ledger started with one source refuses the
// other; an unknown source is refused.
func TestRunRecordNoise(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start("r", 3, 1e-5, "maybe", MechanismDiscrete, "", testHistory); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("unknown noise source: %v", err)
	}
	if err := l.Start("r", 3, 1e-5, seed.Seeded, MechanismDiscrete, "", testHistory); err != nil {
		t.Fatal(err)
	}
	if err := l.Start("r", 3, 1e-5, seed.Crypto, MechanismDiscrete, "", testHistory); !errors.Is(err, ErrRunMismatch) {
		t.Errorf("restart with another noise source: %v", err)
	}
	l.Close()
	rep, err := Audit(path)
	if err != nil || rep.Noise != seed.Seeded || rep.Private {
		t.Errorf("audit of a seeded run: noise %q private %v, %v", rep.Noise, rep.Private, err)
	}
}

// TestRunRecordMechanism: the run record names the mechanism; a restart
// with another one is refused; an unknown one is refused; and the audit
// flags a charge of another mechanism than the record's.
func TestRunRecordMechanism(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Start("r", 30, 1e-5, seed.Crypto, "fancy", "", testHistory); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("unknown mechanism: %v", err)
	}
	if err := l.Start("r", 30, 1e-5, seed.Crypto, MechanismDiscrete, "", testHistory); err != nil {
		t.Fatal(err)
	}
	if err := l.Start("r", 30, 1e-5, seed.Crypto, MechanismFloat, "", testHistory); !errors.Is(err, ErrRunMismatch) {
		t.Errorf("restart with another mechanism: %v", err)
	}
	if _, err := l.Charge(1, accounting.SubsampledDiscreteGaussian(0.01, 1), at(1, 2), false); err != nil {
		t.Fatal(err)
	}
	if rep, err := Audit(path); err != nil || !rep.OK || rep.Mechanism != MechanismDiscrete {
		t.Errorf("audit: %+v, %v", rep, err)
	}
	if _, err := l.Charge(2, accounting.SubsampledGaussian(0.01, 1), at(1, 3), false); err != nil {
		t.Fatal(err)
	}
	if rep, _ := Audit(path); rep.OK || len(rep.Problems) != 1 {
		t.Errorf("a Gaussian charge in a discrete run: %+v", rep)
	}
}

package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// chargedLedger writes a ledger of run with steps charges, accounted by
// accountant, and returns its bytes and ends[i], the size of its first
// i+1 records (the run record and i charges).
func chargedLedger(t testing.TB, run, accountant string, steps int) (data []byte, ends []int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(run, 50, 1e-5, seed.Crypto, MechanismFloat, accountant, testHistory); err != nil {
		t.Fatal(err)
	}
	ends = append(ends, l.Size())
	e := accounting.SubsampledGaussian(testQ, testSigma)
	for step := 1; step <= steps; step++ {
		if _, err := l.Charge(int64(step), e, at(1, uint64(2*step)), false); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, l.Size())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	data, err = os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data, ends
}

// openPrefix writes data's first n bytes as a ledger file and opens it.
func openPrefix(t *testing.T, data []byte, n int64) (*Ledger, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.log")
	if err := os.WriteFile(path, data[:n], 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

// TestExtendEqualsOpen: a ledger holding a prefix of another and extended
// by the rest is byte for byte that ledger, with the state Open rebuilds
// from it (ε, charges, last index and step), and charges on as it does.
func TestExtendEqualsOpen(t *testing.T) {
	data, ends := chargedLedger(t, "extend", AccountantPLD, 30)
	for _, n := range []int64{0, ends[0], ends[11], int64(len(data))} {
		l, path := openPrefix(t, data, n)
		if err := l.Extend(data[n:]); err != nil {
			t.Fatalf("extending %d bytes by %d: %v", n, len(data)-int(n), err)
		}
		got, _ := os.ReadFile(path)
		if !bytes.Equal(got, data) {
			t.Fatalf("extended from %d bytes: the file differs from the ledger it copies", n)
		}
		full, _ := openPrefix(t, data, int64(len(data)))
		if l.Spent() != full.Spent() || l.Charges() != full.Charges() || l.LastIndex() != full.LastIndex() || l.lastStep != full.lastStep {
			t.Errorf("extended from %d bytes: ε %v, %d charges, index %d, step %d; opened: %v, %d, %d, %d", n,
				l.Spent(), l.Charges(), l.LastIndex(), l.lastStep, full.Spent(), full.Charges(), full.LastIndex(), full.lastStep)
		}
		e := accounting.SubsampledGaussian(testQ, testSigma)
		a, err := l.Charge(31, e, at(1, 62), false)
		if err != nil {
			t.Fatal(err)
		}
		b, err := full.Charge(31, e, at(1, 62), false)
		if err != nil {
			t.Fatal(err)
		}
		if a.Hash != b.Hash || a.Epsilon != b.Epsilon {
			t.Errorf("extended from %d bytes: the next charge is %v (ε %v), opened: %v (ε %v)", n, a.Hash, a.Epsilon, b.Hash, b.Epsilon)
		}
	}
}

// TestExtendRefusesWhatDoesNotFollow: a tail that does not continue the
// ledger (from another ledger, with a record skipped, torn, or with a
// flipped byte) is refused as ErrCorrupt and the file is left as it was.
func TestExtendRefusesWhatDoesNotFollow(t *testing.T) {
	data, ends := chargedLedger(t, "extend", AccountantRDP, 20)
	other, otherEnds := chargedLedger(t, "another", AccountantRDP, 20)
	prefix := ends[7] // the run record and 7 charges
	flipped := bytes.Clone(data[prefix:])
	flipped[len(flipped)/2] ^= 0x20
	cases := map[string][]byte{
		"another run's tail":      other[otherEnds[7]:],
		"torn":                    data[prefix : len(data)-3],
		"a flipped byte":          flipped,
		"a record skipped":        data[ends[8]:],
		"the ledger from the top": data,
	}
	for name, tail := range cases {
		l, path := openPrefix(t, data, prefix)
		err := l.Extend(tail)
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Extend = %v, want ErrCorrupt", name, err)
		}
		got, _ := os.ReadFile(path)
		if !bytes.Equal(got, data[:prefix]) || l.Size() != prefix {
			t.Errorf("%s: the refused tail changed the file (%d bytes, was %d)", name, len(got), prefix)
		}
		if _, err := l.Charge(8, accounting.SubsampledGaussian(testQ, testSigma), at(1, 16), false); err != nil {
			t.Errorf("%s: the ledger cannot charge after a refused tail: %v", name, err)
		}
	}
}

// FuzzExtend: any tail is either refused, leaving the file unchanged, or
// appended whole, and the file then opens to the state Extend left.
func FuzzExtend(f *testing.F) {
	data, ends := chargedLedger(f, "fuzz", AccountantRDP, 6)
	prefix := ends[2]
	f.Add(data[prefix:])
	f.Add(data[prefix : len(data)-4])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, tail []byte) {
		l, path := openPrefix(t, data, prefix)
		err := l.Extend(tail)
		got, _ := os.ReadFile(path)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Extend error is not ErrCorrupt: %v", err)
			}
			if !bytes.Equal(got, data[:prefix]) {
				t.Fatal("a refused tail changed the file")
			}
			return
		}
		if !bytes.Equal(got, append(bytes.Clone(data[:prefix]), tail...)) {
			t.Fatal("the file is not the prefix and the tail")
		}
		reopened, _ := openPrefix(t, got, int64(len(got)))
		if reopened.Spent() != l.Spent() || reopened.Charges() != l.Charges() {
			t.Fatalf("reopened: ε %v, %d charges; extended: ε %v, %d", reopened.Spent(), reopened.Charges(), l.Spent(), l.Charges())
		}
	})
}

// Package conformance locates the reference vectors that the conformance
// tests of dpadam and ledger read. The vectors' source of truth is
// ../shared/conformance beside the checkout; a copy is committed under
// internal/conformance/vectors so that a clone without ../shared runs the
// same tests on the same data. When both are present they must be equal,
// byte for byte, so the copy cannot silently go stale.
package conformance

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Path returns the path of the reference-vector file name (for example
// "accountant_vectors.json"): the shared file when it is beside the
// checkout, else the committed copy. It fails t if the copy is missing,
// the shared file is unreadable, or the two differ.
func Path(t testing.TB, name string) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("conformance: cannot locate the package's source directory")
	}
	here := filepath.Dir(file)
	committed := filepath.Join(here, "vectors", name)
	shared := filepath.Join(here, "..", "..", "..", "shared", "conformance", name)
	want, err := os.ReadFile(committed)
	if err != nil {
		t.Fatalf("conformance: reading the committed copy: %v", err)
	}
	got, err := os.ReadFile(shared)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		t.Logf("conformance: %s is not beside the checkout; using the committed copy %s", shared, committed)
		return committed
	case err != nil:
		t.Fatalf("conformance: reading %s: %v", shared, err)
	case !bytes.Equal(got, want):
		t.Fatalf("conformance: the committed copy %s differs from %s: copy the shared file over it", committed, shared)
	}
	return shared
}

// Package conformance locates the reference vectors that the conformance
// tests of dpadam and ledger read: the files under testdata/conformance at
// the repository root (their provenance, checksums and readers are listed
// in testdata/conformance/README.md). A clone therefore runs the same tests
// on the same data wherever it is. Tests that also honour an environment
// variable naming another vector file (DPADAM_VECTORS, ACCOUNTANT_VECTORS)
// check that file in addition to the committed one.
package conformance

import (
	"path/filepath"
	"runtime"
	"testing"
)

// Dir returns the directory that holds the committed reference vectors,
// testdata/conformance at the repository root. It fails t if the package's
// source directory cannot be located.
func Dir(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("conformance: cannot locate the package's source directory")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "conformance")
}

// Path returns the path of the committed reference-vector file name (for
// example "accountant_vectors.json"). The caller reads it and fails if it
// is missing: a missing vector file is a failure, never a skip.
func Path(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(Dir(t), name)
}

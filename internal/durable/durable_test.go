package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// entries lists dir's names, to catch leftover temporary files (Go's
// Glob matches names starting with a dot too).
func entries(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func writeString(s string) func(*os.File) error {
	return func(f *os.File) error {
		_, err := f.WriteString(s)
		return err
	}
}

func TestReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	if err := Replace(path, 0o640, writeString("one")); err != nil {
		t.Fatal(err)
	}
	if err := Replace(path, 0o640, writeString("two")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "two" {
		t.Fatalf("after two replaces: %q, %v", b, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("directory holds %v, want only state", names)
	}

	// A failing writer changes nothing and leaves no temporary file, even
	// after writing part of its content.
	boom := errors.New("boom")
	err = Replace(path, 0o640, func(f *os.File) error {
		f.WriteString("half")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing writer: %v, want its error", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Errorf("after a failed replace: %q, want the old contents", b)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("after a failed replace the directory holds %v", names)
	}

	// No directory: an error, nothing created.
	if err := Replace(filepath.Join(dir, "missing", "x"), 0o600, writeString("x")); err == nil {
		t.Error("Replace into a missing directory succeeded")
	}
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	if err := Create(path, 0o600, writeString("secret")); err != nil {
		t.Fatal(err)
	}
	err := Create(path, 0o600, writeString("other"))
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want fs.ErrExist", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "secret" {
		t.Errorf("after a refused Create: %q, want the first contents", b)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("directory holds %v, want only key", names)
	}
}

func TestSyncDir(t *testing.T) {
	if err := SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing directory: %v, want fs.ErrNotExist", err)
	}
}

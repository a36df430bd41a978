package pki_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dpcluster/dpcluster/pki"
)

// TestWriteBundle: a bundle is ca.crt, ID.key and ID.crt copied byte for
// byte, in a 0700 folder, the key 0600; a second one for the same ID, an
// ID without files and an invalid ID are refused and write nothing.
func TestWriteBundle(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, err := pki.Init(dir, names(), nil, 30); err != nil {
		t.Fatal(err)
	}
	written, err := pki.WriteBundle(dir, "node-0")
	if err != nil {
		t.Fatal(err)
	}
	b := pki.BundlePath(dir, "node-0")
	if b != filepath.Join(dir, "hosts", "node-0") {
		t.Errorf("BundlePath %s", b)
	}
	var want []string
	for _, f := range pki.BundleFiles("node-0") {
		want = append(want, filepath.Join(b, f))
	}
	if !slices.Equal(written, want) || !slices.Equal(pki.BundleFiles("node-0"), []string{"ca.crt", "node-0.key", "node-0.crt"}) {
		t.Errorf("written %q, want %q", written, want)
	}
	for _, p := range written {
		src, _ := os.ReadFile(filepath.Join(dir, filepath.Base(p)))
		if got, err := os.ReadFile(p); err != nil || string(got) != string(src) {
			t.Errorf("%s is not a copy of %s: %v", p, filepath.Base(p), err)
		}
	}
	for p, m := range map[string]fs.FileMode{b: 0o700, filepath.Dir(b): 0o700, want[0]: 0o644, want[1]: 0o600, want[2]: 0o644} {
		if got := mode(t, p); got != m {
			t.Errorf("%s: mode %v, want %v", p, got, m)
		}
	}
	if err := pki.CheckBundleFree(dir, "node-0"); !errors.Is(err, pki.ErrExists) {
		t.Errorf("CheckBundleFree of a written bundle: %v", err)
	}
	if err := pki.CheckBundleFree(dir, "r1"); err != nil {
		t.Errorf("CheckBundleFree of r1: %v", err)
	}
	if _, err := pki.WriteBundle(dir, "node-0"); !errors.Is(err, pki.ErrExists) {
		t.Errorf("second bundle: %v, want ErrExists", err)
	}
	for _, id := range []string{"node-9", "../x", ""} {
		if w, err := pki.WriteBundle(dir, id); err == nil || w != nil {
			t.Errorf("WriteBundle(%q): %q, %v; want an error", id, w, err)
		}
		if _, err := os.Lstat(pki.BundlePath(dir, id)); id != "" && err == nil {
			t.Errorf("WriteBundle(%q) left %s", id, pki.BundlePath(dir, id))
		}
	}
}

package conformance

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// checksumRow matches a row of the README's file table: | `name.json` | `sha256` | ...
var checksumRow = regexp.MustCompile("(?m)^\\| `([^`]+\\.json)` \\| `([0-9a-f]{64})` \\|")

// readmeChecksums returns the sha256 the README lists for each vector file.
func readmeChecksums(t *testing.T, dir string) map[string]string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatalf("reading the vectors' README: %v", err)
	}
	sums := map[string]string{}
	for _, m := range checksumRow.FindAllStringSubmatch(string(readme), -1) {
		sums[m[1]] = m[2]
	}
	if len(sums) == 0 {
		t.Fatalf("%s/README.md lists no `file.json` | `sha256` rows", dir)
	}
	return sums
}

// TestVectorsMatchREADME checks that the committed vector files are exactly
// the ones README.md lists, with the checksums it states, and that each
// equals the shared reference set byte for byte where that set is beside
// the checkout (../shared/conformance, as in the development workplace).
func TestVectorsMatchREADME(t *testing.T) {
	dir := Dir(t)
	sums := readmeChecksums(t, dir)
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	var listed []string
	for name := range sums {
		listed = append(listed, name)
	}
	slices.Sort(listed)
	if !slices.Equal(names, listed) {
		t.Fatalf("files in %s: %v; README lists %v", dir, names, listed)
	}
	shared := filepath.Join(dir, "..", "..", "..", "shared", "conformance")
	for _, name := range names {
		got, err := os.ReadFile(Path(t, name))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(got)
		if h := hex.EncodeToString(sum[:]); h != sums[name] {
			t.Errorf("sha256(%s) = %s, README says %s", name, h, sums[name])
		}
		want, err := os.ReadFile(filepath.Join(shared, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			t.Logf("%s: no shared set beside the checkout (%s); checked against the README only", name, shared)
		case err != nil:
			t.Errorf("reading the shared copy: %v", err)
		case !bytes.Equal(got, want):
			t.Errorf("%s differs from the shared reference set's %s: copy it over and update the README's checksum", Path(t, name), filepath.Join(shared, name))
		}
	}
}

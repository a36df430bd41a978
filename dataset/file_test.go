package dataset

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// checkRead checks a ReadFile result field by field.
func checkRead(t *testing.T, d *Dataset, err error, x []float32, y []int32, shape []int, classes int, names []string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("ReadFile result does not validate: %v", err)
	}
	if !slices.Equal(d.X, x) {
		t.Errorf("X = %v, want %v", d.X, x)
	}
	if !slices.Equal(d.Y, y) {
		t.Errorf("Y = %v, want %v", d.Y, y)
	}
	if !slices.Equal(d.Shape, shape) || (d.Shape == nil) != (shape == nil) {
		t.Errorf("Shape = %#v, want %#v", d.Shape, shape)
	}
	if d.Classes != classes {
		t.Errorf("Classes = %d, want %d", d.Classes, classes)
	}
	if !slices.Equal(d.LabelNames, names) || (d.LabelNames == nil) != (names == nil) {
		t.Errorf("LabelNames = %#v, want %#v", d.LabelNames, names)
	}
}

// wantErr checks that err wraps sentinel, is one line, and mentions each
// of subs.
func wantErr(t *testing.T, err, sentinel error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one wrapping %v mentioning %q", sentinel, subs)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %q does not wrap %v", err, sentinel)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("error is not one line: %q", err)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

func TestFormatOf(t *testing.T) {
	dir := t.TempDir()
	for path, want := range map[string]string{
		"a.csv":             FormatCSV,
		"a.CSV":             FormatCSV,
		"x/y.npy":           FormatNPY,
		"data.npz":          FormatNPZ,
		"t.Parquet":         FormatParquet,
		dir:                 FormatImageFolder,
		dir + "/absent.csv": FormatCSV,
	} {
		got, err := FormatOf(path)
		if err != nil || got != want {
			t.Errorf("FormatOf(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	_, err := FormatOf(writeFile(t, dir, "notes.txt", []byte("hi")))
	wantErr(t, err, ErrFormat, "notes.txt", `".txt"`, ".csv, .npy, .npz, .parquet")
	_, err = FormatOf(filepath.Join(dir, "absent"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("FormatOf(missing file) = %v, want a not-exist error naming it", err)
	}
}

func TestReadFileMissing(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a.csv", "a.npy", "a.npz", "a.parquet"} {
		path := filepath.Join(dir, name)
		_, err := ReadFile(path, FileOptions{})
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
			t.Errorf("ReadFile(%s) = %v, want a not-exist error naming the file", name, err)
		}
	}
}

func TestReadFileOptions(t *testing.T) {
	path := writeFile(t, t.TempDir(), "d.csv", []byte("1,2\n"))
	for _, tt := range []struct {
		o    FileOptions
		want string
	}{
		{FileOptions{Classes: -1}, "--classes -1"},
		{FileOptions{Labels: []string{}}, "--labels is empty"},
		{FileOptions{Labels: []string{"a", "b", "a"}}, `"a" appears twice`},
		{FileOptions{Labels: []string{"a\x00"}}, "NUL"},
		{FileOptions{Labels: []string{"a", "b"}, Classes: 3}, "--classes 3 but 2 class names (--labels"},
		{FileOptions{InputShape: []int{}}, "InputShape is empty"},
		{FileOptions{InputShape: []int{2, 0}}, "non-positive"},
		{FileOptions{InputShape: []int{1 << 20, 1 << 20}}, "InputShape"},
		{FileOptions{FeatureColumns: []string{}}, "FeatureColumns is empty"},
		{FileOptions{LabelColumn: "y", FeatureColumns: []string{"a", "y"}}, `label column "y"`},
		{FileOptions{FeatureColumns: []string{"label"}}, `label column "label"`},
		{FileOptions{LabelColumn: "y", FeatureColumns: []string{"a", "a"}}, `"a" appears twice`},
		{FileOptions{FeatureColumns: []string{"a"}}, "FeatureColumns needs a CSV header"},
	} {
		_, err := ReadFile(path, tt.o)
		wantErr(t, err, ErrFileOptions, path, tt.want)
	}
}

func TestReadFileNameAndShape(t *testing.T) {
	path := writeFile(t, t.TempDir(), "iris.data.csv", []byte("1,1,2,3,4\n0,5,6,7,8\n"))
	d, err := ReadFile(path, FileOptions{InputShape: []int{2, 2}})
	checkRead(t, d, err, []float32{1, 2, 3, 4, 5, 6, 7, 8}, []int32{1, 0}, []int{2, 2}, 2, nil)
	if d.Name != "iris.data" {
		t.Errorf("Name = %q, want the base name without extension", d.Name)
	}
	d, err = ReadFile(path, FileOptions{Name: "iris", Classes: 4})
	checkRead(t, d, err, []float32{1, 2, 3, 4, 5, 6, 7, 8}, []int32{1, 0}, nil, 4, nil)
	if d.Name != "iris" {
		t.Errorf("Name = %q, want iris", d.Name)
	}
	_, err = ReadFile(path, FileOptions{InputShape: []int{3}})
	wantErr(t, err, ErrFormat, path, "4 features per row", "InputShape [3]")
}

func TestLabelSetHash(t *testing.T) {
	ints := LabelSetHash(nil, 3)
	if len(ints) != 64 || strings.Trim(ints, "0123456789abcdef") != "" {
		t.Fatalf("LabelSetHash = %q, want 64 hex digits", ints)
	}
	if got := LabelSetHash([]string{"0", "1", "2"}, 0); got != ints {
		t.Errorf("names 0,1,2 hash %s, integer labels %s: want equal", got, ints)
	}
	// echo -ne '0\x001\x002\x00' | sha256sum
	if want := "9b9a3cbf2b718a8f94ce348cb95246738a3a9871c6236f4da0a7cc126f03a8b4"; ints != want {
		t.Errorf("hash %s, want %s, the SHA-256 of the names each followed by a 0 byte", ints, want)
	}
	distinct := map[string][]string{
		"3 ints":  nil,
		"2 ints":  {"0", "1"},
		"cat dog": {"cat", "dog"},
		"dog cat": {"dog", "cat"},
		"catdog":  {"catdog"},
		"cat do":  {"cat", "dog", ""},
	}
	seen := map[string]string{}
	for name, names := range distinct {
		h := LabelSetHash(names, 3)
		if other, dup := seen[h]; dup {
			t.Errorf("%s and %s hash the same", name, other)
		}
		seen[h] = name
	}
}

func TestDatasetLabelNames(t *testing.T) {
	d := &Dataset{X: []float32{1, 2}, Y: []int32{0, 1}, Dim: 1, Classes: 2, LabelNames: []string{"cat", "dog"}}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	s := d.Subset([]int{1})
	if !slices.Equal(s.LabelNames, d.LabelNames) {
		t.Fatalf("Subset LabelNames = %v", s.LabelNames)
	}
	s.LabelNames[0] = "x"
	if d.LabelNames[0] != "cat" {
		t.Fatal("Subset shares LabelNames with its source")
	}
	d.LabelNames = []string{"cat"}
	if err := d.Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("1 name for 2 classes: Validate = %v", err)
	}
	d.LabelNames = []string{"cat", "cat"}
	if err := d.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"cat"`) {
		t.Fatalf("duplicate names: Validate = %v", err)
	}
	// ContentHash ignores LabelNames.
	d.LabelNames = nil
	h := d.ContentHash()
	d.LabelNames = []string{"a", "b"}
	if d.ContentHash() != h {
		t.Fatal("ContentHash depends on LabelNames")
	}
}

// Fuzz limits: a fuzzed ReadFile may allocate fuzzAllocLimit bytes plus
// 4096 per input byte, and take fuzzHang.
const (
	fuzzAllocLimit = 64 << 20
	fuzzHang       = 30 * time.Second
)

// fuzzReadFile writes data to a file named name in a fresh directory,
// reads it with ReadFile (or reads the directory, for an image folder) and
// checks the result validates or the error wraps ErrFormat and is one
// line, and that the read allocated in proportion to the input. A read
// that hangs crashes the test binary with every goroutine's stack.
func fuzzReadFile(t *testing.T, name string, data []byte, readDir bool, o FileOptions) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, dir, name, data)
	if readDir {
		path = dir
	}
	hang := time.AfterFunc(fuzzHang, func() {
		buf := make([]byte, 1<<20)
		panic(fmt.Sprintf("ReadFile hangs on %q:\n%s", data, buf[:runtime.Stack(buf, true)]))
	})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d, err := ReadFile(path, o)
	runtime.ReadMemStats(&after)
	hang.Stop()
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > fuzzAllocLimit+4096*uint64(len(data)) {
		t.Fatalf("ReadFile allocated %d bytes for %d bytes of input", alloc, len(data))
	}
	if err != nil {
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("error %v does not wrap ErrFormat", err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("error is not one line: %q", err)
		}
		return
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("accepted input gives an invalid dataset: %v", err)
	}
}

// lowerReadLimit lowers maxReadValues for a fuzz test.
func lowerReadLimit(f *testing.F) {
	old := maxReadValues
	maxReadValues = 1 << 18
	f.Cleanup(func() { maxReadValues = old })
}

package dataset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFakeFashion writes the four Fashion-MNIST files (tiny 2×3 images) into
// dir, gzip-compressed if gz, and returns their contents by name.
func writeFakeFashion(t *testing.T, dir string, gz bool) map[string][]byte {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	trI, trL := smallImages(7, 10)
	teI, teL := smallImages(3, 10)
	out := map[string][]byte{}
	for i, raw := range [][]byte{trI, trL, teI, teL} {
		name := fashionFiles[i]
		b := raw
		if gz {
			b = gzipBytes(t, raw)
		} else {
			name = strings.TrimSuffix(name, ".gz")
		}
		writeFile(t, dir, name, b)
		out[name] = b
	}
	return out
}

// isolated returns options that search nothing on the real machine.
func isolated(t *testing.T) LoadOptions {
	o := DefaultLoadOptions()
	o.UseEnv = false
	o.SystemDir = ""
	o.CacheDir = filepath.Join(t.TempDir(), "cache")
	return o
}

func checkFake(t *testing.T, train, test *Dataset) {
	t.Helper()
	if got, want := train.Len(), 7; got != want {
		t.Fatalf("train Len = %d, want %d", got, want)
	}
	if got, want := test.Len(), 3; got != want {
		t.Fatalf("test Len = %d, want %d", got, want)
	}
	if train.Classes != 10 || test.Classes != 10 {
		t.Fatalf("classes = %d, %d, want 10", train.Classes, test.Classes)
	}
	for _, d := range []*Dataset{train, test} {
		if err := d.Validate(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoadFashionMNISTSearchOrder(t *testing.T) {
	for _, gz := range []bool{true, false} {
		o := isolated(t)
		o.Dir = t.TempDir()
		writeFakeFashion(t, o.Dir, gz)
		train, test, err := LoadFashionMNIST(context.Background(), o)
		if err != nil {
			t.Fatalf("gz=%v: %v", gz, err)
		}
		checkFake(t, train, test)
	}

	// $DPCLUSTER_DATA/fashion-mnist is found; an explicit but empty Dir is
	// skipped (and reported), and the env directory wins over the cache.
	root := t.TempDir()
	writeFakeFashion(t, filepath.Join(root, "fashion-mnist"), true)
	t.Setenv(FashionMNISTEnv, root)
	o := isolated(t)
	o.UseEnv = true
	o.Dir = t.TempDir()
	// A corrupt cache must not be reached: the env directory comes first.
	writeFakeFashion(t, o.CacheDir, true)
	writeFile(t, o.CacheDir, fashionFiles[0], []byte("garbage"))
	train, test, err := LoadFashionMNIST(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkFake(t, train, test)

	// With the env ignored, the corrupt cache is found and its error returned
	// rather than silently skipped.
	o.UseEnv = false
	if _, _, err := LoadFashionMNIST(context.Background(), o); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("corrupt cache: err = %v, want a decode error", err)
	}
}

func TestLoadFashionMNISTNotFound(t *testing.T) {
	o := isolated(t)
	o.Dir = t.TempDir()
	o.SystemDir = filepath.Join(t.TempDir(), "nonexistent")
	writeFile(t, o.Dir, fashionFiles[1], []byte{}) // incomplete directory
	t.Setenv(FashionMNISTEnv, "")
	_, _, err := LoadFashionMNIST(context.Background(), o)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	msg := err.Error()
	for _, want := range []string{o.Dir, o.CacheDir, o.SystemDir, "apt-get install dataset-fashion-mnist", FashionMNISTEnv, "AllowDownload", "missing train-images-idx3-ubyte.gz"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
}

// fileServer serves files by name and counts requests.
func fileServer(t *testing.T, files map[string][]byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func sums(files map[string][]byte) map[string][]string {
	out := map[string][]string{}
	for name, b := range files {
		h := sha256.Sum256(b)
		out[name] = []string{hex.EncodeToString(h[:])}
	}
	return out
}

func cacheEntries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestLoadFashionMNISTDownload(t *testing.T) {
	files := writeFakeFashion(t, t.TempDir(), true)
	srv := fileServer(t, files)
	o := isolated(t)
	o.AllowDownload = true
	o.BaseURL = srv.URL + "/"
	o.SHA256 = sums(files)
	train, test, err := LoadFashionMNIST(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkFake(t, train, test)
	if got, want := len(cacheEntries(t, o.CacheDir)), 4; got != want {
		t.Fatalf("cache holds %v, want the 4 files only", cacheEntries(t, o.CacheDir))
	}
	// A second load finds the cache and needs no server.
	srv.Close()
	if _, _, err := LoadFashionMNIST(context.Background(), o); err != nil {
		t.Fatalf("cached load: %v", err)
	}
}

func TestLoadFashionMNISTDownloadChecksumMismatch(t *testing.T) {
	files := writeFakeFashion(t, t.TempDir(), true)
	want := sums(files)
	tampered := map[string][]byte{}
	for k, v := range files {
		tampered[k] = v
	}
	bad := append([]byte(nil), files[fashionFiles[2]]...)
	bad[len(bad)-1] ^= 1
	tampered[fashionFiles[2]] = bad
	srv := fileServer(t, tampered)
	o := isolated(t)
	o.AllowDownload = true
	o.BaseURL = srv.URL + "/"
	o.SHA256 = want
	_, _, err := LoadFashionMNIST(context.Background(), o)
	if !errors.Is(err, ErrChecksum) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrChecksum and ErrNotFound", err)
	}
	for _, name := range cacheEntries(t, o.CacheDir) {
		if name == fashionFiles[2] || strings.Contains(name, ".tmp-") {
			t.Fatalf("cache keeps %s after a checksum mismatch", name)
		}
	}
	// Fixing the server completes the cache without refetching good files.
	srv.Config.Handler = fileServer(t, files).Config.Handler
	if _, _, err := LoadFashionMNIST(context.Background(), o); err != nil {
		t.Fatalf("retry: %v", err)
	}
}

func TestLoadFashionMNISTDownloadErrors(t *testing.T) {
	files := writeFakeFashion(t, t.TempDir(), true)
	srv := fileServer(t, map[string][]byte{}) // 404 for everything
	o := isolated(t)
	o.AllowDownload = true
	o.BaseURL = srv.URL + "/"
	o.SHA256 = sums(files)
	if _, _, err := LoadFashionMNIST(context.Background(), o); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o.BaseURL = fileServer(t, files).URL + "/"
	if _, _, err := LoadFashionMNIST(ctx, o); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v, want context.Canceled", err)
	}
	o.BaseURL = "http://example.invalid" // no trailing slash
	if _, _, err := LoadFashionMNIST(context.Background(), o); err == nil {
		t.Fatal("BaseURL without '/' accepted")
	}
	o.BaseURL = "http://example.invalid/"
	o.SHA256 = map[string][]string{"other.gz": nil}
	if _, _, err := LoadFashionMNIST(context.Background(), o); err == nil {
		t.Fatal("unknown SHA256 key accepted")
	}
}

func debianFashionOrSkip(t *testing.T) {
	t.Helper()
	if _, missing := findFashionFiles(DebianFashionMNISTDir); missing != "" {
		t.Skipf("real Fashion-MNIST not installed in %s (%s): run `apt-get install dataset-fashion-mnist` (CI does)", DebianFashionMNISTDir, missing)
	}
}

func TestFashionMNISTReal(t *testing.T) {
	debianFashionOrSkip(t)
	type split struct {
		d    *Dataset
		n    int
		name string
	}
	var splits []split
	if raceEnabled {
		// Under -race the 60000-image train split alone takes ~20 s on a
		// shared 2-core machine; check the test split only (the train split
		// is checked by the same code in the ordinary `go test` run).
		test, err := LoadIDX("fashion-mnist-test", filepath.Join(DebianFashionMNISTDir, fashionFiles[2]),
			filepath.Join(DebianFashionMNISTDir, fashionFiles[3]), FashionMNISTClasses)
		if err != nil {
			t.Fatal(err)
		}
		splits = []split{{test, 10000, "fashion-mnist-test"}}
	} else {
		o := isolated(t)
		o.SystemDir = DebianFashionMNISTDir
		train, test, err := LoadFashionMNIST(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		splits = []split{{train, 60000, "fashion-mnist-train"}, {test, 10000, "fashion-mnist-test"}}
	}
	digests := map[string][2]string{ // images, labels
		"fashion-mnist-train": {"c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888", "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"},
		"fashion-mnist-test":  {"5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b", "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"},
	}
	for _, c := range splits {
		if err := c.d.Validate(); err != nil {
			t.Fatal(err)
		}
		if got, want := c.d.Len(), c.n; got != want {
			t.Fatalf("%s: Len = %d, want %d", c.name, got, want)
		}
		if c.d.Name != c.name || c.d.Dim != 784 || c.d.Classes != 10 || len(c.d.Shape) != 3 || c.d.Shape[1] != 28 || c.d.Shape[2] != 28 {
			t.Fatalf("%s: metadata %q dim %d shape %v classes %d", c.name, c.d.Name, c.d.Dim, c.d.Shape, c.d.Classes)
		}
		// Fashion-MNIST is exactly balanced.
		counts := make([]int, 10)
		for _, y := range c.d.Y {
			counts[y]++
		}
		for k, got := range counts {
			if want := c.n / 10; got != want {
				t.Fatalf("%s: class %d has %d examples, want %d", c.name, k, got, want)
			}
		}
		// The decompressed content is the published dataset (digests in the
		// fashionSHA256 doc comment). The IDX bytes are rebuilt from the
		// Dataset (pixels are k/255, so rounding inverts them), which also
		// checks the conversion.
		px := make([]byte, len(c.d.X))
		for i, v := range c.d.X {
			px[i] = byte(math.Round(float64(v) * 255))
		}
		lb := make([]byte, c.d.Len())
		for i, y := range c.d.Y {
			lb[i] = byte(y)
		}
		want := digests[c.name]
		if got := sha256.Sum256(idxBytes([]int{c.d.Len(), 28, 28}, px)); hex.EncodeToString(got[:]) != want[0] {
			t.Errorf("%s: images SHA-256 = %x, want %s", c.name, got, want[0])
		}
		if got := sha256.Sum256(idxBytes([]int{c.d.Len()}, lb)); hex.EncodeToString(got[:]) != want[1] {
			t.Errorf("%s: labels SHA-256 = %x, want %s", c.name, got, want[1])
		}
	}
}

// TestFashionMNISTDownloadRealDigests serves the Debian package's files over
// HTTP and downloads them with the built-in digests, so the hard-coded
// values are exercised.
func TestFashionMNISTDownloadRealDigests(t *testing.T) {
	debianFashionOrSkip(t)
	files := map[string][]byte{}
	for _, name := range fashionFiles {
		b, err := os.ReadFile(filepath.Join(DebianFashionMNISTDir, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	srv := fileServer(t, files)
	o := isolated(t)
	o.AllowDownload = true
	o.BaseURL = srv.URL + "/"
	if err := downloadFashion(context.Background(), o, o.CacheDir, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	for _, name := range fashionFiles {
		f, err := os.Open(filepath.Join(o.CacheDir, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		io.Copy(h, f)
		f.Close()
		if got, want := hex.EncodeToString(h.Sum(nil)), fashionSHA256[name][1]; got != want {
			t.Fatalf("%s: cached digest %s, want %s", name, got, want)
		}
	}
}

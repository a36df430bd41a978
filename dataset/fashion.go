package dataset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dpcluster/dpcluster/internal/durable"
)

// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017, arXiv:1708.07747): 60000 train
// and 10000 test 28×28 grayscale images in 10 classes, in IDX format.
const (
	// FashionMNISTEnv names the environment variable LoadFashionMNIST
	// consults: the files may sit in $DPCLUSTER_DATA/fashion-mnist or directly
	// in $DPCLUSTER_DATA.
	FashionMNISTEnv = "DPCLUSTER_DATA"
	// DebianFashionMNISTDir is where the Debian/Ubuntu package
	// dataset-fashion-mnist installs the four .gz files
	// (`apt-get install dataset-fashion-mnist`).
	DebianFashionMNISTDir = "/usr/share/datasets/fashion-mnist"
	// FashionMNISTURL is the official download location.
	FashionMNISTURL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
	// FashionMNISTClasses is the number of classes.
	FashionMNISTClasses = 10
	// maxDownloadBytes bounds one downloaded file (the largest is 26.4 MB).
	maxDownloadBytes = 64 << 20
)

// fashionFiles are the four file names, as published and as installed by
// the Debian package. An uncompressed file without the .gz suffix is
// accepted in a directory too (compression is detected by content).
var fashionFiles = [4]string{
	"train-images-idx3-ubyte.gz",
	"train-labels-idx1-ubyte.gz",
	"t10k-images-idx3-ubyte.gz",
	"t10k-labels-idx1-ubyte.gz",
}

// fashionSHA256 lists, per file, the SHA-256 digests a download may have.
//
// The first digest of each file is that of the official .gz file at
// FashionMNISTURL (26421880, 29515, 4422102 and 5148 bytes; the same values
// are pinned by TensorFlow Datasets and other loaders).
//
// The second is that of the file the Debian package dataset-fashion-mnist
// (0.0~git20200523.55506a9-1) ships, measured with sha256sum on
// /usr/share/datasets/fashion-mnist. Debian re-compressed the files: their
// gzip headers carry no file name (each file is exactly len(name)+1 bytes
// shorter than the official one) and a different mtime, so the .gz digests
// differ while the decompressed IDX content is the original. A mirror of
// the Debian files therefore verifies too. The decompressed IDX files have
// SHA-256 (checked by TestFashionMNISTReal):
//
//	train-images-idx3-ubyte c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888
//	train-labels-idx1-ubyte bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9
//	t10k-images-idx3-ubyte  5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b
//	t10k-labels-idx1-ubyte  0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34
var fashionSHA256 = map[string][]string{
	"train-images-idx3-ubyte.gz": {
		"3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
		"b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
	},
	"train-labels-idx1-ubyte.gz": {
		"a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
		"0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
	},
	"t10k-images-idx3-ubyte.gz": {
		"346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
		"cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
	},
	"t10k-labels-idx1-ubyte.gz": {
		"67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
		"8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
	},
}

// Errors returned by LoadFashionMNIST.
var (
	// ErrNotFound is returned (wrapped, with every place searched and how
	// to get the data) when no location holds the dataset and downloading
	// is off or failed.
	ErrNotFound = errors.New("dataset: Fashion-MNIST not found")
	// ErrChecksum is returned when a downloaded file's SHA-256 matches none
	// of the expected digests; the file is not kept.
	ErrChecksum = errors.New("dataset: checksum mismatch")
)

// LoadOptions configures LoadFashionMNIST.
type LoadOptions struct {
	// Dir, if set, is searched first.
	Dir string
	// UseEnv makes the search consult $DPCLUSTER_DATA (default true).
	UseEnv bool
	// CacheDir is the download cache; "" means
	// os.UserCacheDir()/dpcluster/fashion-mnist.
	CacheDir string
	// SystemDir is the distribution package directory searched after the
	// cache (default DebianFashionMNISTDir; "" skips it).
	SystemDir string
	// AllowDownload permits fetching the files from BaseURL into CacheDir
	// when no directory holds them. Off by default.
	AllowDownload bool
	// BaseURL is the download location, ending in '/' (default
	// FashionMNISTURL).
	BaseURL string
	// SHA256 overrides the accepted digests of the downloaded files, keyed
	// by file name; nil means the built-in official and Debian digests.
	// Meant for tests and private mirrors.
	SHA256 map[string][]string
	// HTTPClient performs downloads (default http.DefaultClient).
	HTTPClient *http.Client
	// Logger receives progress messages (default: discard).
	Logger *slog.Logger
}

// DefaultLoadOptions returns the options LoadFashionMNIST is meant to run
// with: search Dir (unset), $DPCLUSTER_DATA, the user cache and the Debian
// directory; no download.
func DefaultLoadOptions() LoadOptions {
	return LoadOptions{
		UseEnv:    true,
		SystemDir: DebianFashionMNISTDir,
		BaseURL:   FashionMNISTURL,
	}
}

// Validate reports option combinations that cannot work.
func (o LoadOptions) Validate() error {
	if o.AllowDownload && !strings.HasSuffix(o.BaseURL, "/") {
		return fmt.Errorf("dataset: LoadOptions.BaseURL %q must end in '/'", o.BaseURL)
	}
	for name := range o.SHA256 {
		if !slices.Contains(fashionFiles[:], name) {
			return fmt.Errorf("dataset: LoadOptions.SHA256 has unknown file %q", name)
		}
	}
	return nil
}

// LoadFashionMNIST finds and loads Fashion-MNIST as two image Datasets
// (Shape [1,28,28], pixels scaled to [0,1], 10 classes).
//
// It searches, in order: opts.Dir; $DPCLUSTER_DATA/fashion-mnist and
// $DPCLUSTER_DATA (if opts.UseEnv); the cache dir; opts.SystemDir (the
// Debian package's /usr/share/datasets/fashion-mnist). A directory qualifies
// when it holds all four files, each either as the published .gz name or
// uncompressed without the suffix; the first that qualifies is loaded, and a
// corrupt file there is an error (the search does not silently move on).
// If none qualifies and opts.AllowDownload is set, the missing files are
// downloaded from opts.BaseURL into the cache dir, each verified against
// its SHA-256 before it is fsynced and renamed into place. Otherwise the
// error wraps ErrNotFound and lists every place searched.
func LoadFashionMNIST(ctx context.Context, opts LoadOptions) (train, test *Dataset, err error) {
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cache := opts.CacheDir
	if cache == "" {
		if ucd, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(ucd, "dpcluster", "fashion-mnist")
		}
	}
	var dirs, looked []string
	if opts.Dir != "" {
		dirs = append(dirs, opts.Dir)
	}
	if env := os.Getenv(FashionMNISTEnv); opts.UseEnv && env != "" {
		dirs = append(dirs, filepath.Join(env, "fashion-mnist"), env)
	} else if opts.UseEnv {
		looked = append(looked, "$"+FashionMNISTEnv+" (unset)")
	}
	if cache != "" {
		dirs = append(dirs, cache)
	}
	if opts.SystemDir != "" {
		dirs = append(dirs, opts.SystemDir)
	}

	for _, dir := range dirs {
		paths, missing := findFashionFiles(dir)
		if missing != "" {
			looked = append(looked, fmt.Sprintf("%s (%s)", dir, missing))
			if dir == opts.Dir {
				log.Warn("Fashion-MNIST not in the explicit directory, searching on", "dir", dir, "missing", missing)
			}
			continue
		}
		log.Info("loading Fashion-MNIST", "dir", dir)
		return loadFashionPaths(paths)
	}
	if !opts.AllowDownload || cache == "" {
		if cache == "" {
			looked = append(looked, "user cache dir (unavailable: $HOME/$XDG_CACHE_HOME unset)")
		}
		if !opts.AllowDownload {
			looked = append(looked, "download from "+opts.BaseURL+" (disabled: AllowDownload not set)")
		}
		return nil, nil, notFound(looked)
	}
	if err := downloadFashion(ctx, opts, cache, log); err != nil {
		looked = append(looked, fmt.Sprintf("download from %s into %s (failed, see below)", opts.BaseURL, cache))
		return nil, nil, fmt.Errorf("%w\ndownload error: %w", notFound(looked), err)
	}
	paths, missing := findFashionFiles(cache)
	if missing != "" {
		return nil, nil, fmt.Errorf("dataset: after download, %s: %s", cache, missing)
	}
	return loadFashionPaths(paths)
}

func notFound(looked []string) error {
	return fmt.Errorf("%w; looked in:\n  %s\nto get it: `sudo apt-get install dataset-fashion-mnist` (installs into %s), "+
		"or put the four files (%s) in a directory and set %s to it, or set LoadOptions.AllowDownload",
		ErrNotFound, strings.Join(looked, "\n  "), DebianFashionMNISTDir, strings.Join(fashionFiles[:], ", "), FashionMNISTEnv)
}

// findFashionFiles returns the paths of the four files in dir, or a
// description of what is missing.
// CheckFashionMNISTDir returns nil if dir holds the four Fashion-MNIST
// files (gzipped or not), and otherwise an error saying what is missing:
// the directory, every file, or some of them. It reads no data: a command
// given an explicit directory checks it before anything loads.
func CheckFashionMNISTDir(dir string) error {
	if _, missing := findFashionFiles(dir); missing != "" {
		return fmt.Errorf("%w: %s", ErrNotFound, missing)
	}
	return nil
}

func findFashionFiles(dir string) (paths [4]string, missing string) {
	var miss []string
	for i, name := range fashionFiles {
		found := false
		for _, cand := range []string{name, strings.TrimSuffix(name, ".gz")} {
			p := filepath.Join(dir, cand)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				paths[i], found = p, true
				break
			}
		}
		if !found {
			miss = append(miss, name)
		}
	}
	switch {
	case len(miss) == len(fashionFiles):
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return paths, "no such directory"
		}
		return paths, "no Fashion-MNIST files"
	case len(miss) > 0:
		return paths, "missing " + strings.Join(miss, ", ")
	}
	return paths, ""
}

func loadFashionPaths(p [4]string) (train, test *Dataset, err error) {
	// The two sets decode at once: the time to a run's first step.
	var testErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		test, testErr = LoadIDX("fashion-mnist-test", p[2], p[3], FashionMNISTClasses)
	}()
	train, err = LoadIDX("fashion-mnist-train", p[0], p[1], FashionMNISTClasses)
	<-done
	if err != nil {
		return nil, nil, err
	}
	if testErr != nil {
		return nil, nil, testErr
	}
	if train.Dim != test.Dim || !slices.Equal(train.Shape, test.Shape) {
		return nil, nil, fmt.Errorf("%w: train images %v but test images %v", ErrIDXMismatch, train.Shape, test.Shape)
	}
	return train, test, nil
}

// downloadFashion fetches every file not already in cache.
func downloadFashion(ctx context.Context, opts LoadOptions, cache string, log *slog.Logger) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("dataset: %w", err)
	}
	sums := opts.SHA256
	if sums == nil {
		sums = fashionSHA256
	}
	client := opts.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	for _, name := range fashionFiles {
		dst := filepath.Join(cache, name)
		if _, err := os.Stat(dst); err == nil {
			continue // only verified files are ever renamed into the cache
		}
		log.Info("downloading Fashion-MNIST file", "url", opts.BaseURL+name, "dest", dst)
		if err := downloadVerified(ctx, client, opts.BaseURL+name, dst, sums[name]); err != nil {
			return err
		}
	}
	return nil
}

// downloadVerified writes url's body to a temporary file next to dst,
// checks its SHA-256 against want, fsyncs it, renames it to dst and fsyncs
// the directory. On any failure the temporary file is removed.
func downloadVerified(ctx context.Context, client *http.Client, url, dst string, want []string) (err error) {
	if len(want) == 0 {
		return fmt.Errorf("%w: no expected digest for %s", ErrChecksum, filepath.Base(dst))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("dataset: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("dataset: download: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("dataset: download %s: %s", url, resp.Status)
	}
	var fetchErr error // the download's own errors, returned unwrapped
	err = durable.Replace(dst, 0o600, func(f *os.File) error {
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, maxDownloadBytes+1))
		switch got := hex.EncodeToString(h.Sum(nil)); {
		case err != nil:
			fetchErr = fmt.Errorf("dataset: download %s: %w", url, err)
		case n > maxDownloadBytes:
			fetchErr = fmt.Errorf("dataset: download %s: larger than %d bytes", url, maxDownloadBytes)
		case !slices.Contains(want, got):
			fetchErr = fmt.Errorf("%w: %s has SHA-256 %s, want one of %v", ErrChecksum, url, got, want)
		}
		return fetchErr
	})
	if fetchErr != nil {
		return fetchErr
	}
	if err != nil {
		return fmt.Errorf("dataset: saving %s: %w", dst, err)
	}
	return nil
}

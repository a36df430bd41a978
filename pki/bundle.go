package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dpcluster/dpcluster/internal/durable"
)

// BundlesDir is the folder of an Init directory that holds the per-machine
// bundles WriteBundle writes: DIR/hosts/ID/.
const BundlesDir = "hosts"

// BundlePath is DIR/hosts/ID, the folder of id's bundle.
func BundlePath(dir, id string) string { return filepath.Join(dir, BundlesDir, id) }

// BundleFiles are the names of the files in id's bundle, in the order
// WriteBundle writes them: the CA's certificate, id's key and id's
// certificate. Never the CA's key.
func BundleFiles(id string) []string { return []string{CACertFile, id + ".key", id + ".crt"} }

// CheckBundleFree returns ErrExists (wrapped, naming the folder) if id's
// bundle folder exists, so that a caller can refuse before writing
// anything.
func CheckBundleFree(dir, id string) error {
	p := BundlePath(dir, id)
	if _, err := os.Lstat(p); err == nil {
		return fmt.Errorf("%w: %s exists", ErrExists, p)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// WriteBundle copies to DIR/hosts/ID/ exactly what the machine of id needs
// and nothing else: DIR/ca.crt (mode 0644), DIR/ID.key (0600) and DIR/ID.crt
// (0644), the files Init wrote; never ca.key. DIR/hosts and DIR/hosts/ID
// are created mode 0700; DIR/hosts/ID must not exist (ErrExists, nothing
// written). It returns the paths it wrote, in BundleFiles' order; if it
// fails part way, the paths written so far with the error (each file is
// whole or absent, as with WriteFileExclusive).
func WriteBundle(dir, id string) (written []string, err error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	files := BundleFiles(id)
	data := make([][]byte, len(files))
	for i, f := range files {
		if data[i], err = os.ReadFile(filepath.Join(dir, f)); err != nil {
			return nil, fmt.Errorf("pki: bundle of %s: %w", id, err)
		}
	}
	bundle := BundlePath(dir, id)
	if err := os.MkdirAll(filepath.Dir(bundle), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(bundle, 0o700); errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: %s exists", ErrExists, bundle)
	} else if err != nil {
		return nil, err
	}
	if err := durable.SyncDir(filepath.Dir(bundle)); err != nil {
		return nil, err
	}
	for i, f := range files {
		perm := os.FileMode(0o644)
		if f == id+".key" {
			perm = 0o600
		}
		p := filepath.Join(bundle, f)
		if err := WriteFileExclusive(p, data[i], perm); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	return written, nil
}

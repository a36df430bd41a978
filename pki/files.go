package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dpcluster/dpcluster/internal/durable"
)

// Name is a certificate to issue: a role and an ID.
type Name struct {
	Role Role
	ID   string
}

// ErrExists is returned (wrapped, naming the file) when a file Init would
// write already exists. It wraps fs.ErrExist too.
var ErrExists = fmt.Errorf("pki: refusing to overwrite: %w", fs.ErrExist)

// CheckNames validates names: a known role, a valid ID other than "ca",
// and no ID twice (even under two roles: an ID names its files).
func CheckNames(names []Name) error {
	seen := map[string]Role{}
	for _, n := range names {
		if !n.Role.Valid() {
			return fmt.Errorf("%w %q", ErrUnknownRole, n.Role)
		}
		if err := checkID(n.ID); err != nil {
			return err
		}
		if r, ok := seen[n.ID]; ok {
			return fmt.Errorf("pki: ID %q given twice (as %s and as %s)", n.ID, r, n.Role)
		}
		seen[n.ID] = n.Role
	}
	return nil
}

// Init writes the run's PKI to dir (created, mode 0700, if missing) and
// returns the paths of the files it wrote, in order. If dir holds ca.crt
// and ca.key it issues with that CA (LoadCA), otherwise it creates one
// (NewCA(days)) and writes it first; one of the two alone is an error.
// For each name it writes ID.key then ID.crt (Issue(ca, role, ID, hosts,
// days)). It checks names (CheckNames) and refuses, before writing
// anything, if a name's file exists (ErrExists). If it fails part way (a
// full disk), the paths written so far are returned with the error; no
// file is left half-written.
func Init(dir string, names []Name, hosts []string, days int) (written []string, err error) {
	if err := CheckNames(names); err != nil {
		return nil, err
	}
	if err := checkDays(days); err != nil {
		return nil, err
	}
	if _, _, err := splitHosts(hosts); err != nil {
		return nil, err
	}
	for _, n := range names {
		for _, p := range []string{certPath(dir, n.ID), keyPath(dir, n.ID)} {
			if _, err := os.Lstat(p); err == nil {
				return nil, fmt.Errorf("%w: %s exists", ErrExists, p)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := LoadCA(dir)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		for _, f := range []string{CACertFile, CAKeyFile} {
			if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
				return nil, fmt.Errorf("pki: %s holds %s but not the other CA file; restore it or remove both", dir, f)
			}
		}
		if ca, err = NewCA(days); err != nil {
			return nil, err
		}
		if written, err = writePair(written, dir, "ca", ca); err != nil {
			return written, err
		}
	default:
		return nil, err
	}
	for _, n := range names {
		p, err := Issue(ca, n.Role, n.ID, hosts, days)
		if err != nil {
			return written, err
		}
		if written, err = writePair(written, dir, n.ID, p); err != nil {
			return written, err
		}
	}
	return written, nil
}

func certPath(dir, id string) string { return filepath.Join(dir, id+".crt") }
func keyPath(dir, id string) string  { return filepath.Join(dir, id+".key") }

// writePair writes dir/name.key (0600) then dir/name.crt (0644) and
// appends their paths to written.
func writePair(written []string, dir, name string, p *KeyPair) ([]string, error) {
	keyPEM, err := p.KeyPEM()
	if err != nil {
		return written, err
	}
	if err := WriteFileExclusive(keyPath(dir, name), keyPEM, 0o600); err != nil {
		return written, err
	}
	written = append(written, keyPath(dir, name))
	if err := WriteFileExclusive(certPath(dir, name), p.CertPEM(), 0o644); err != nil {
		return written, err
	}
	return append(written, certPath(dir, name)), nil
}

// WriteFileExclusive writes data to a new file path with mode perm, whole
// or not at all: it writes a temporary file in the same directory, fsyncs
// it, links it to path (which fails, wrapping ErrExists, if path exists:
// an existing file is never replaced), removes the temporary name and
// fsyncs the directory.
func WriteFileExclusive(path string, data []byte, perm os.FileMode) error {
	err := durable.Create(path, perm, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: %s exists", ErrExists, path)
	}
	return err
}

// HasCA reports whether dir holds both ca.crt and ca.key (it does not
// check their contents: LoadCA does).
func HasCA(dir string) bool {
	for _, f := range []string{CACertFile, CAKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}

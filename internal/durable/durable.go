// Package durable writes files so that a crash leaves either the old
// contents or the new, never a mix, and so that a completed write survives
// power loss: the sequence of hashicorp/raft's file snapshots and etcd's
// fileutil (write a temporary file in the same directory, fsync it, rename
// or link it into place, fsync the directory).
//
// Every package that persists state (the Raft log's stable store, the
// ledger, the PKI's keys, exports, downloaded datasets) uses it, so the
// sequence is written, and reviewed, once.
package durable

import (
	"fmt"
	"os"
	"path/filepath"
)

// SyncDir fsyncs the directory dir, making the creation, removal or
// renaming of its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// Replace atomically replaces (or creates) the file at path with what write
// writes, with mode perm. write gets a temporary file in path's directory;
// if it returns an error, nothing at path changes and the temporary file is
// removed. Otherwise the temporary file is fsynced and renamed over path,
// and the directory is fsynced. A crash part-way leaves path as it was
// (and, at worst, a temporary file named "."+base+".tmp-*" beside it).
func Replace(path string, perm os.FileMode, write func(*os.File) error) error {
	tmp, err := writeTemp(path, perm, write)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after the rename, a no-op
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// Create is Replace for a file that must not exist yet: it links the
// finished temporary file to path, which fails with an error wrapping
// fs.ErrExist if path exists; an existing file is never replaced.
func Create(path string, perm os.FileMode, write func(*os.File) error) error {
	tmp, err := writeTemp(path, perm, write)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after the link, removes only the temporary name
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	if err := os.Remove(tmp); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// writeTemp writes a complete, fsynced, closed temporary file beside path
// and returns its name; on error it has removed it.
func writeTemp(path string, perm os.FileMode, write func(*os.File) error) (name string, err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return "", err
	}
	if err := write(f); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

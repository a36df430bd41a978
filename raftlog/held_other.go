//go:build !linux

package raftlog

import "io/fs"

// lockListed reports that this system has no lock table Held can read:
// Held probes the lock instead.
func lockListed(fs.FileInfo) (held, listed bool) { return false, false }

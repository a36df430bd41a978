//go:build unix && !linux

package e2e

import "syscall"

// sysProcAttr puts a child in its own process group. Without Linux's
// Pdeathsig, a child outlives a test binary that dies without running its
// cleanups (a `go test -timeout` panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

package e2e

import "syscall"

// sysProcAttr puts a child in its own process group (so a ^C at the
// terminal reaches only the test binary, whose cleanup kills it) and asks
// the kernel to SIGKILL it if the test binary dies first, e.g. on a
// `go test -timeout` panic, when no t.Cleanup runs.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

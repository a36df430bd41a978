//go:build unix

package e2e

import (
	"fmt"
	"os"
	"testing"
)

// TestMain makes the directory the binaries are built into, once per test
// binary run, and removes it after the tests (binaries builds them lazily,
// so a run that selects no process test builds nothing).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dpcluster-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

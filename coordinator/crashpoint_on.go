//go:build dpcrashpoints

package coordinator

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// crashPoint kills this process, as a crash would (SIGKILL: no deferred
// function runs, nothing is flushed), when CrashAtEnv names point and
// step and its marker file can be created. Only binaries built with -tags
// dpcrashpoints have it (e2e builds its binaries so); product
// builds have the no-op of crashpoint_off.go.
func crashPoint(point string, step int64) {
	spec := os.Getenv(CrashAtEnv)
	p, rest, ok := strings.Cut(spec, ":")
	if !ok || p != point {
		return
	}
	s, marker, ok := strings.Cut(rest, ":")
	if n, err := strconv.ParseInt(s, 10, 64); !ok || err != nil || n != step || marker == "" {
		return
	}
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return // another process crashed here already
	}
	f.Close()
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // until the signal lands
}

// Package procstat reads this process's memory figures from Linux's
// /proc/self/status, for the memory tests and bench/step.
package procstat

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrUnavailable is returned where /proc/self/status does not exist or
// lacks the field (a unix other than Linux).
var ErrUnavailable = errors.New("procstat: not available on this system")

// PeakRSS returns this process's peak resident set size (VmHWM) in bytes.
func PeakRSS() (int64, error) { return field("VmHWM") }

// RSS returns this process's current resident set size (VmRSS) in bytes.
func RSS() (int64, error) { return field("VmRSS") }

// field returns a "Name:   N kB" line of /proc/self/status in bytes.
func field(name string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if errors.Is(err, os.ErrNotExist) {
		return 0, ErrUnavailable
	}
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	return parse(string(b), name)
}

func parse(status, name string) (int64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		v, ok := strings.CutPrefix(line, name+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("procstat: %s: %w", name, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("%w: no %s", ErrUnavailable, name)
}

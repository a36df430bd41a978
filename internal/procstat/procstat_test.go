package procstat

import (
	"errors"
	"runtime"
	"testing"
)

func TestParse(t *testing.T) {
	status := "Name:\ttest\nVmPeak:\t  900 kB\nVmHWM:\t    1234 kB\nVmRSS:\t  1000 kB\n"
	if got, err := parse(status, "VmHWM"); err != nil || got != 1234<<10 {
		t.Errorf("VmHWM = %d, %v; want %d", got, err, 1234<<10)
	}
	if _, err := parse(status, "VmSwap"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("missing field: %v, want ErrUnavailable", err)
	}
	if _, err := parse("VmHWM:\tlots kB\n", "VmHWM"); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("garbled field: %v, want a parse error", err)
	}
}

// On Linux the peak is positive and at least the current RSS.
func TestPeakRSS(t *testing.T) {
	if runtime.GOOS != "linux" {
		if _, err := PeakRSS(); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("PeakRSS on %s: %v, want ErrUnavailable", runtime.GOOS, err)
		}
		return
	}
	// Current first: the peak, read after, covers it even if memory grew
	// in between (the kernel reports VmHWM as max(high-water mark, RSS)).
	rss, err := RSS()
	if err != nil {
		t.Fatal(err)
	}
	peak, err := PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 || peak < rss {
		t.Fatalf("peak %d, current %d: want 0 < current ≤ peak", peak, rss)
	}
}

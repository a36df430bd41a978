package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
)

// TestProgressETA: the bar gives the time left at the current rate, to
// the step limit or, without one, to the target ε.
func TestProgressETA(t *testing.T) {
	for _, tc := range []struct {
		max         int64
		eps, target float64
		want        string
	}{
		{max: 1000, eps: 0.5, target: 3, want: "ETA 1m30s"}, // 989 steps left at 11 steps/s
		{max: 0, eps: 0.5, target: 3, want: "ETA 5s"},       // ε to grow 5 times as much again: 55 steps at 11 steps/s
	} {
		var buf bytes.Buffer
		p, _ := newProgress(&buf, "on", nil)
		now := time.Unix(0, 0)
		p.now = func() time.Time { return now }
		p.update(coordinator.Progress{Step: 1, MaxSteps: tc.max, Epsilon: 0.05, TargetEpsilon: tc.target})
		now = now.Add(time.Second)
		p.update(coordinator.Progress{Step: 11, MaxSteps: tc.max, Epsilon: tc.eps, TargetEpsilon: tc.target})
		if got := p.line(now); !strings.Contains(got, tc.want) {
			t.Errorf("max steps %d: bar %q lacks %q", tc.max, got, tc.want)
		}
	}
}

// TestLogLinesAboveTheBar: a log line written while the bar is on screen
// clears the bar, goes above it, and the bar is drawn again below; after
// the bar ends, writes go through as they are.
func TestLogLinesAboveTheBar(t *testing.T) {
	var buf bytes.Buffer
	lw := &lockedWriter{w: &buf}
	p, _ := newProgress(lw, "on", nil)
	p.update(coordinator.Progress{Step: 1, MaxSteps: 10, TargetEpsilon: 3})
	bar := lw.bar
	if bar == "" || !strings.Contains(bar, "step 1/10") {
		t.Fatalf("bar %q", bar)
	}
	buf.Reset()
	fmt.Fprintln(lw, "level=INFO msg=hello")
	if got, want := buf.String(), clearLine+"level=INFO msg=hello\n"+bar; got != want {
		t.Fatalf("log line over the bar: %q, want %q", got, want)
	}
	p.finish()
	buf.Reset()
	fmt.Fprintln(lw, "after")
	if buf.String() != "after\n" {
		t.Fatalf("after the bar: %q", buf.String())
	}
}

package cli

import (
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
)

// TestTuneGC: a process holding a large training set collects with about
// gcHeadroom of headroom instead of 100% of its live heap, a small one is
// left at the default, and an explicit GOGC always wins.
func TestTuneGC(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	big := &dataset.Dataset{X: make([]float32, 60000*784), Y: make([]int32, 60000)} // Fashion-MNIST's training set
	test := &dataset.Dataset{X: make([]float32, 10000*784), Y: make([]int32, 10000)}

	t.Setenv("GOGC", "")
	os.Unsetenv("GOGC")
	p := tuneGC(log, dataBytes(big, test, nil))
	if got := debug.SetGCPercent(100); got != p || p < 50 || p > 65 {
		t.Errorf("Fashion-MNIST (%d MB): percent %d (runtime %d), want about 100·128 MiB/220 MB", (4*len(big.X)+4*len(test.X))>>20, p, got)
	}
	if p := tuneGC(log, dataBytes(test)); p != 0 || debug.SetGCPercent(100) != 100 {
		t.Errorf("a 31 MB data set changed the percent to %d", p)
	}
	if p := tuneGC(log, 4<<30); p != 10 {
		t.Errorf("4 GiB of data: percent %d, want the floor 10", p)
	}
	debug.SetGCPercent(100)
	t.Setenv("GOGC", "200")
	if p := tuneGC(log, dataBytes(big)); p != 0 || debug.SetGCPercent(100) != 100 {
		t.Errorf("GOGC set: tuneGC set %d", p)
	}
}

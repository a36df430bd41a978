package cli

import (
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

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

// liveHeap reads the live heap of the last collection.
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// gogcNow reads the collector's percent without changing it.
func gogcNow() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestGCTuner: with a live heap of model-sized vectors far larger than
// gcHeadroom the tuner lowers the percent to gcPercentFor(the live heap),
// Stop restores what it found, and with GOGC set it changes nothing.
func TestGCTuner(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	t.Setenv("GOGC", "")
	os.Unsetenv("GOGC")

	held := make([]float32, 96<<20) // 384 MiB live, pointer-free (not touched: no RSS)
	runtime.GC()
	tu := startGCTuner(log, time.Millisecond)
	// The percent must follow the live heap: 128 MiB over it. The live
	// heap is the held vector plus whatever the package's other tests,
	// running in parallel, hold at the time, so it is read, not assumed
	// (CI once had 29 here, with other tests holding about 60 MiB).
	var got, want int
	for deadline := time.Now().Add(10 * time.Second); ; {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
		got, want = gogcNow(), gcPercentFor(liveHeap())
		if d := got - want; d >= -2 && d <= 2 || time.Now().After(deadline) {
			break
		}
	}
	runtime.KeepAlive(held)
	if d := got - want; d < -2 || d > 2 || got > gcPercentFor(384<<20)+1 {
		t.Errorf("percent %d, want %d for the live heap, and at most %d (384 MiB held)", got, want, gcPercentFor(384<<20))
	}
	tu.Stop()
	if p := gogcNow(); p != 100 {
		t.Errorf("after Stop: percent %d, want the 100 it found", p)
	}
	tu.Stop() // a second Stop is harmless

	t.Setenv("GOGC", "100")
	tu = startGCTuner(log, time.Millisecond)
	held = make([]float32, 96<<20)
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if p := gogcNow(); p != 100 {
		t.Errorf("GOGC set: the tuner changed the percent to %d", p)
	}
	runtime.KeepAlive(held)
	tu.Stop()

	for _, c := range []struct {
		live int64
		want int
	}{{0, 100}, {gcHeadroom, 100}, {2 * gcHeadroom, 50}, {20 * gcHeadroom, 10}, {100 * gcHeadroom, 10}} {
		if got := gcPercentFor(c.live); got != c.want {
			t.Errorf("gcPercentFor(%d) = %d, want %d", c.live, got, c.want)
		}
	}
}

package cli

import (
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/dpcluster/dpcluster/dataset"
)

// gcHeadroom is how far the heap may grow past its live size between
// collections in a process that holds a training set or a model's state
// (see gcPercentFor).
const gcHeadroom = 128 << 20

// The collector's percent stays between these: 100 is Go's default, and
// below 10 a collection would run every few allocations of a large heap.
const (
	minGCPercent = 10
	maxGCPercent = 100
)

// gcTunePeriod is how often the commands' gcTuner reads the live heap.
const gcTunePeriod = 500 * time.Millisecond

// gcPercentFor is the collector's percent (GOGC) that lets a live heap of
// live bytes grow about gcHeadroom between collections instead of the
// default 100%, within [minGCPercent, maxGCPercent]. The heaps this is for
// are mostly training sets and model-sized vectors (θ, the optimizer's
// moments, sums, noise, encodings): pointer-free, so a collection does not
// scan them, and held for the whole run, so headroom in proportion to them
// costs a second copy's worth of memory for nothing (docs/BENCHMARKS.md,
// issue 15: 522 → 395 MB peak RSS for `local --nodes 1`, the step time
// unchanged; issue 25: the 20M-parameter model's buffers).
func gcPercentFor(live int64) int {
	if live <= gcHeadroom {
		return maxGCPercent
	}
	return min(max(int(100*gcHeadroom/live), minGCPercent), maxGCPercent)
}

// gogcSet reports whether the environment chooses the percent.
func gogcSet() bool {
	_, set := os.LookupEnv("GOGC")
	return set
}

// tuneGC sets the collector's percent for a process whose live heap is
// about to be mostly data sets of dataBytes (dataBytes), before the data's
// first collection: gcPercentFor(dataBytes) where that is below Go's
// default. An explicit GOGC in the environment is left alone. It returns
// the percent it set, or 0. The gcTuner refines it from the measured heap.
func tuneGC(log *slog.Logger, dataBytes int64) int {
	if gogcSet() || dataBytes <= gcHeadroom {
		return 0
	}
	p := gcPercentFor(dataBytes)
	debug.SetGCPercent(p)
	log.Debug("garbage collector tuned for the data sets", "data_bytes", dataBytes, "gc_percent", p)
	return p
}

// dataBytes is the memory the data sets ds hold (nil ones hold none).
func dataBytes(ds ...*dataset.Dataset) int64 {
	var n int64
	for _, d := range ds {
		if d != nil {
			n += 4*int64(len(d.X)) + 4*int64(len(d.Y))
		}
	}
	return n
}

// gcTuner keeps the collector's percent at gcPercentFor(the live heap) as
// the heap changes: after the data, a run's model-sized state (at 20M
// parameters the leader and three in-process nodes hold dozens of 80 MB
// vectors, far more than the training set) is what the percent must be
// sized to, and only the running process knows how many it holds. It
// reads the live heap of the last collection (runtime/metrics
// /gc/heap/live:bytes) every period. Its goroutine is owned by the
// command that starts it, which stops it (Stop waits for it and restores
// the percent it found); with GOGC set it does nothing.
type gcTuner struct {
	stop   chan struct{}
	done   sync.WaitGroup
	before int
}

// startGCTuner starts a gcTuner that checks the heap every period.
func startGCTuner(log *slog.Logger, period time.Duration) *gcTuner {
	t := &gcTuner{stop: make(chan struct{}), before: -1}
	if gogcSet() {
		return t
	}
	cur := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	if metrics.Read(cur); cur[0].Value.Kind() != metrics.KindUint64 {
		return t // not in this runtime: leave the percent alone
	}
	t.before = int(cur[0].Value.Uint64())
	t.done.Add(1)
	go func() {
		defer t.done.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		set := t.before
		for {
			select {
			case <-t.stop:
				return
			case <-tick.C:
			}
			metrics.Read(sample)
			if sample[0].Value.Kind() != metrics.KindUint64 {
				return // not in this runtime: leave the percent alone
			}
			live := int64(sample[0].Value.Uint64())
			if p := gcPercentFor(live); live > 0 && p != set {
				debug.SetGCPercent(p)
				log.Debug("garbage collector tuned for the live heap", "live_bytes", live, "gc_percent", p)
				set = p
			}
		}
	}()
	return t
}

// Stop stops the tuner, waits for its goroutine and restores the percent
// it found.
func (t *gcTuner) Stop() {
	if t.before < 0 {
		return
	}
	close(t.stop)
	t.done.Wait()
	debug.SetGCPercent(t.before)
	t.before = -1
}

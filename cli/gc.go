package cli

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/dpcluster/dpcluster/dataset"
)

// gcHeadroom is how far the heap may grow past its live size between
// collections in a process that holds a training set (see tuneGC).
const gcHeadroom = 128 << 20

// tuneGC sets the garbage collector's percent (GOGC) for a process whose
// live heap is mostly data sets of dataBytes (dataBytes), so that the heap may grow about
// gcHeadroom past the live heap between collections instead of the
// default 100%: a training set is read-only, pointer-free (collections do
// not scan it) and held for the whole run, and headroom in proportion to
// it costs a second copy's worth of memory for nothing (docs/BENCHMARKS.md,
// issue 15: 522 → 395 MB peak RSS for `local --nodes 1`, the step time
// unchanged). An explicit GOGC in the environment is left alone. It
// returns the percent it set, or 0.
func tuneGC(log *slog.Logger, dataBytes int64) int {
	if _, set := os.LookupEnv("GOGC"); set || dataBytes <= gcHeadroom {
		return 0
	}
	p := max(int(100*gcHeadroom/dataBytes), 10)
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

package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/coordinator"
)

// recorder is called on the leader's loop after every applied step: it
// notes when each step was first applied and samples the live heap; at
// the warm-up's last step it snapshots the nodes' compute histograms and
// starts the profile, which stops at the last step (before the final
// evaluation and the model's export).
type recorder struct {
	warmup      int64
	total       int64 // the last step: the profile stops there
	reg         *prometheus.Registry
	profile     string
	heapProfile string

	mu          sync.Mutex
	times       map[int64]time.Time
	last        int64
	before      map[string][2]float64 // node → compute (sum s, count) at the warm-up's end
	linksBefore map[string][2]float64 // the leader's links (linkSeconds) at the warm-up's end
	peakHeap    uint64
	// bytes is the embedded server's delivered bytes at the warm-up's
	// last step and at the last step (deliveredBytes).
	bytes     [2]float64
	bytesSeen [2]bool
	profiling bool
	err       error
}

var liveHeap = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}

func (r *recorder) onStep(p coordinator.Progress) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.times == nil {
		r.times = map[int64]time.Time{}
	}
	if _, seen := r.times[p.Step]; seen {
		return // an evaluation's callback
	}
	r.times[p.Step] = now
	r.last = max(r.last, p.Step)
	metrics.Read(liveHeap)
	if v := liveHeap[0].Value; v.Kind() == metrics.KindUint64 {
		r.peakHeap = max(r.peakHeap, v.Uint64())
	}
	if p.Step == r.total && r.profiling {
		pprof.StopCPUProfile()
		r.profiling = false
	}
	if p.Step == r.total && r.heapProfile != "" {
		r.err = writeHeapProfile(r.heapProfile)
	}
	if p.Step == r.total && r.err == nil {
		r.bytes[1], r.err = deliveredBytes(r.reg)
		r.bytesSeen[1] = true
	}
	if p.Step != r.warmup {
		return
	}
	if r.bytes[0], r.err = deliveredBytes(r.reg); r.err != nil {
		return
	}
	r.bytesSeen[0] = true
	if r.before, r.err = computeSeconds(r.reg); r.err != nil {
		return
	}
	if r.linksBefore, r.err = linkSeconds(r.reg); r.err != nil {
		return
	}
	if r.profile != "" {
		f, err := os.Create(r.profile)
		if err != nil {
			r.err = err
			return
		}
		if r.err = pprof.StartCPUProfile(f); r.err == nil {
			r.profiling = true
		}
	}
}

func (r *recorder) stopProfile() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.profiling {
		pprof.StopCPUProfile()
		r.profiling = false
	}
}

// result computes the step times and the nodes' compute times over the
// steps after the warm-up.
func (r *recorder) result() (result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var res result
	if r.err != nil {
		return res, r.err
	}
	if r.before == nil {
		return res, fmt.Errorf("the run stopped before step %d", r.warmup)
	}
	after, err := computeSeconds(r.reg)
	if err != nil {
		return res, err
	}
	t0, ok := r.times[r.warmup]
	if !ok {
		return res, errors.New("no time for the warm-up's last step")
	}
	var deltas []float64
	for s := r.warmup + 1; s <= r.last; s++ {
		a, okA := r.times[s-1]
		b, okB := r.times[s]
		if okA && okB {
			deltas = append(deltas, b.Sub(a).Seconds()*1e3)
		}
	}
	n := r.last - r.warmup
	res.Steps = int(n)
	res.StepMean = r.times[r.last].Sub(t0).Seconds() * 1e3 / float64(n)
	slices.Sort(deltas)
	if len(deltas) > 0 {
		res.StepP50 = deltas[len(deltas)/2]
	}
	var sum float64
	for node, a := range after {
		b := r.before[node]
		if a[1]-b[1] <= 0 {
			return res, fmt.Errorf("node %s computed nothing after the warm-up", node)
		}
		ms := (a[0] - b[0]) / (a[1] - b[1]) * 1e3
		sum += ms
		res.ComputeMax = max(res.ComputeMax, ms)
	}
	res.ComputeAvg = sum / float64(len(after))
	res.PeakHeap = r.peakHeap
	links, err := linkSeconds(r.reg)
	if err != nil {
		return res, err
	}
	mean := func(k string) float64 {
		a, b := links[k], r.linksBefore[k]
		return (a[0] - b[0]) * 1e3 / float64(n)
	}
	res.Collect, res.Privatize, res.Commit, res.Release = mean("round"), mean("privatize"), mean("commit"), mean("release")
	if !r.bytesSeen[0] || !r.bytesSeen[1] {
		return res, fmt.Errorf("the run stopped before step %d: no bytes per step", r.total)
	}
	res.BytesPerStep = (r.bytes[1] - r.bytes[0]) / float64(r.total-r.warmup)
	res.Log, res.Charge = mean("log"), mean("charge")
	return res, nil
}

// writeHeapProfile collects garbage and writes the heap profile to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// computeSeconds reads every node's dpcluster_node_compute_seconds
// histogram: its sum and count, by node.
func computeSeconds(g prometheus.Gatherer) (map[string][2]float64, error) {
	return histograms(g, "dpcluster_node_compute_seconds", "node")
}

// deliveredBytes reads the run's dpcluster_transport_delivered_bytes_total:
// the bytes its embedded NATS server has delivered to its clients.
func deliveredBytes(g prometheus.Gatherer) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() == "dpcluster_transport_delivered_bytes_total" {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum, nil
		}
	}
	return 0, errors.New("no dpcluster_transport_delivered_bytes_total in the registry")
}

// linkSeconds reads the leader's dpcluster_coordinator_round_seconds (as
// "round") and step_phase_seconds (by phase): sum and count. Builds
// before step_phase_seconds existed report only the round.
func linkSeconds(g prometheus.Gatherer) (map[string][2]float64, error) {
	out, err := histograms(g, "dpcluster_coordinator_step_phase_seconds", "phase")
	if err != nil {
		out = map[string][2]float64{}
	}
	round, err := histograms(g, "dpcluster_coordinator_round_seconds", "")
	if err != nil {
		return nil, err
	}
	out["round"] = round[""]
	return out, nil
}

// histograms reads the histograms named name: sum and count, by the value
// of label ("" for a histogram without it).
func histograms(g prometheus.Gatherer, name, label string) (map[string][2]float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string][2]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				if label != "" && l.GetName() == label {
					key = l.GetValue()
				}
			}
			h := m.GetHistogram()
			out[key] = [2]float64{h.GetSampleSum(), float64(h.GetSampleCount())}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s in the registry", name)
	}
	return out, nil
}

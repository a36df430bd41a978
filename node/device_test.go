package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/transport"
)

// TestCPUDeviceAnswersRounds runs a node given model.OpenDevice("cpu")
// over NATS: it answers with the reference sum bit for bit (the CPU device
// is the Workspace computing without Config.Device), and its metrics, as
// the node command serves them, name the device.
func TestCPUDeviceAnswersRounds(t *testing.T) {
	const seed = 7
	dev, err := model.OpenDevice("cpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Error(err)
		}
	})
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	reg := prometheus.NewRegistry()
	cfg := testConfig()
	cfg.Registerer = reg
	cfg.SeededSampling, cfg.SamplingSeed, cfg.Device = true, seed, dev
	r := start(t, cfg, fx, nc)
	if got := r.w.Device(); got != dev.Info() {
		t.Errorf("Device() = %+v, want %+v", got, dev.Info())
	}
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)
	for step := uint64(1); step <= 2; step++ {
		rs := fx.round(step, step, 1, wait)
		rs.ParamsVersion = 0
		l.publish(rs)
		answersReference(t, fx, cfg, rs, recv(t, l.contribs, "contribution"))
	}

	info := dev.Info()
	wants := []string{
		fmt.Sprintf(`dpcluster_node_device_info{compute_capability="",device="cpu",name=%q,node=%q,run=%q} 1`, info.Name, testNode, testRun),
		fmt.Sprintf(`dpcluster_node_device_memory_bytes{node=%q,run=%q} 0`, testNode, testRun),
		fmt.Sprintf(`dpcluster_node_rounds_total{node=%q,result="answered",run=%q} 2`, testNode, testRun),
	}
	// The node counts a round as answered just after publishing its
	// contribution, so the second count may land after recv returned:
	// scrape until every line is there, for at most 5 s.
	var body string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body = rec.Body.String()
		missing := slices.ContainsFunc(wants, func(w string) bool { return !strings.Contains(body, w) })
		if !missing || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range wants {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s:\n%s", want, body)
		}
	}
}

// answersReference fails the test unless c is the reference's answer to
// rs (count and sum, bit for bit) from a node with cfg's seeded sampling.
func answersReference(t *testing.T, fx fixture, cfg Config, rs transport.RoundStart, c transport.Contribution) {
	t.Helper()
	want, wantN := reference(t, fx, rs, cfg.SamplingSeed, EngineBatch(cfg, fx.shard.Len(), fx.m.ExampleBytes()))
	if int(c.Count) != wantN {
		t.Fatalf("step %d: count = %d, reference %d", rs.Step, c.Count, wantN)
	}
	for i := range want {
		if math.Float32bits(c.Sum[i]) != math.Float32bits(want[i]) {
			t.Fatalf("step %d: sum[%d] = %v, reference %v", rs.Step, i, c.Sum[i], want[i])
		}
	}
}

// fakeDevice is a model.Device whose engines are CPU Workspaces that count
// their use, or whose NewEngine fails with err.
type fakeDevice struct {
	err      error
	maxBatch atomic.Int64 // the last NewEngine's
	engines  atomic.Int64
	sums     atomic.Int64 // ClippedSumIndexed calls, all engines
	closes   atomic.Int64 // engine Close calls, all engines
}

func (d *fakeDevice) Info() model.DeviceInfo {
	return model.DeviceInfo{ID: "fake:0", Name: "Fake Accelerator", MemoryBytes: 1 << 30, ComputeCapability: "9.0"}
}

func (d *fakeDevice) NewEngine(m *model.Model, maxBatch int) (model.Engine, error) {
	d.maxBatch.Store(int64(maxBatch))
	if d.err != nil {
		return nil, d.err
	}
	ws, err := m.NewWorkspace(maxBatch)
	if err != nil {
		return nil, err
	}
	d.engines.Add(1)
	return &fakeEngine{Workspace: ws, dev: d}, nil
}

func (d *fakeDevice) Close() error { return nil }

type fakeEngine struct {
	*model.Workspace
	dev *fakeDevice
}

func (e *fakeEngine) ClippedSumIndexed(dst, theta []float32, d *dataset.Dataset, idx []int, clip float64) (int, error) {
	e.dev.sums.Add(1)
	return e.Workspace.ClippedSumIndexed(dst, theta, d, idx, clip)
}

func (e *fakeEngine) Close() error {
	e.dev.closes.Add(1)
	return nil
}

// TestUnsupportedLayerFailsAtStart: a device without kernels for a layer
// fails NewWorker, naming the device and the layer, before the node sends
// anything; no round ever sees it.
func TestUnsupportedLayerFailsAtStart(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	dev := &fakeDevice{err: fmt.Errorf("%w: layer 0 (dense 8→3)", model.ErrUnsupportedLayer)}
	cfg := testConfig()
	cfg.Device = dev
	w, err := NewWorker(cfg, fx.m, fx.shard, nc, nil)
	if w != nil || !errors.Is(err, ErrEngine) || !errors.Is(err, model.ErrUnsupportedLayer) {
		t.Fatalf("NewWorker = %v, %v; want ErrEngine wrapping model.ErrUnsupportedLayer", w, err)
	}
	for _, want := range []string{"fake:0", "Fake Accelerator", "layer 0 (dense 8→3)", "not supported"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	none(t, l.joins, "join from a node that failed to start")
}

// TestEngineLifetime: NewWorker allocates one engine of EngineBatch
// examples on the device; rounds compute on it; Run releases it once when
// it returns, and Close then does nothing. A Worker that never runs is
// released by Close, after which Run refuses.
func TestEngineLifetime(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	dev := &fakeDevice{}
	cfg := testConfig()
	cfg.Device = dev
	r := start(t, cfg, fx, nc)
	if got, want := dev.maxBatch.Load(), int64(EngineBatch(cfg, fx.shard.Len(), fx.m.ExampleBytes())); got != want || dev.engines.Load() != 1 {
		t.Fatalf("NewEngine: %d engines, last of %d examples; want 1 of %d", dev.engines.Load(), got, want)
	}
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)
	l.publish(fx.round(1, 1, 1, wait))
	c := recv(t, l.contribs, "contribution")
	checkContribution(t, c, fx.shard.Len(), testQ, testClip)
	if dev.sums.Load() == 0 {
		t.Error("the contribution was not computed on the device's engine")
	}
	if err := r.w.Close(); err != nil { // Run owns the engine now
		t.Errorf("Close during Run = %v", err)
	}
	if n := dev.closes.Load(); n != 0 {
		t.Fatalf("engine closed %d times while Run runs", n)
	}
	r.cancel()
	if err := r.result(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if n := dev.closes.Load(); n != 1 {
		t.Errorf("engine closed %d times after Run returned, want 1", n)
	}
	if err := r.w.Close(); err != nil || dev.closes.Load() != 1 {
		t.Errorf("Close after Run = %v, engine closed %d times; want nil, 1", err, dev.closes.Load())
	}

	// A Worker that never runs.
	w, err := NewWorker(cfg, fx.m, fx.shard, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := dev.closes.Load(); n != 2 {
		t.Errorf("engines closed %d times, want 2", n)
	}
	if err := w.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
}

func TestEngineBatch(t *testing.T) {
	for _, tc := range []struct {
		maxBatch, n  int
		q            float64
		memory, each int64
		want         int
	}{
		{0, 400, 0.25, 0, 0, 141},              // ⌈1.25·100⌉ + 16
		{0, 10000, 0.01, 0, 0, 141},            // the same mean batch from another shard
		{0, 10, 1, 0, 0, 10},                   // never more than the shard
		{0, 1, 1e-9, 0, 0, 1},                  // at least one example
		{0, 1000, 0.001, 0, 0, 18},             // ⌈1.25⌉ + 16
		{32, 400, 0.25, 0, 1 << 40, 32},        // MaxBatch set: as given
		{0, 400, 0.25, 0, 100 << 20, 20},       // 2 GiB of 100 MB examples
		{0, 400, 0.25, 1 << 30, 100 << 20, 10}, // 1 GiB of them
		{0, 400, 0.25, 1 << 20, 100 << 20, 1},  // not even one fits: one
		{0, 400, 0.25, 0, 1 << 10, 141},        // small examples: the batch bound
	} {
		cfg := testConfig()
		cfg.MaxBatch, cfg.SampleRate, cfg.EngineMemory = tc.maxBatch, tc.q, tc.memory
		if got := EngineBatch(cfg, tc.n, tc.each); got != tc.want {
			t.Errorf("EngineBatch(MaxBatch %d, q %v, n %d, memory %d, %d bytes an example) = %d, want %d",
				tc.maxBatch, tc.q, tc.n, tc.memory, tc.each, got, tc.want)
		}
	}
}

// hostDevice is a fakeDevice whose engines implement model.HostAllocator
// as the CUDA engine does: they hand out buffers of their own (or refuse
// every AllocHost with allocErr), count the steps whose θ or sum is not
// one of them, and poison their buffers on Close, as the real engine's
// release makes them unusable.
type hostDevice struct {
	fakeDevice
	allocErr error
	mu       sync.Mutex
	bufs     [][]float32
	allocs   int // AllocHost calls
	foreign  int // steps computed on θ or into a sum not from AllocHost
}

func (d *hostDevice) NewEngine(m *model.Model, maxBatch int) (model.Engine, error) {
	e, err := d.fakeDevice.NewEngine(m, maxBatch)
	if err != nil {
		return nil, err
	}
	return &hostEngine{fakeEngine: e.(*fakeEngine), dev: d}, nil
}

type hostEngine struct {
	*fakeEngine
	dev *hostDevice
}

func (e *hostEngine) AllocHost(n int) ([]float32, error) {
	d := e.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	d.allocs++
	if d.allocErr != nil {
		return nil, d.allocErr
	}
	v := make([]float32, n)
	d.bufs = append(d.bufs, v)
	return v, nil
}

func (e *hostEngine) ClippedSumIndexed(dst, theta []float32, ds *dataset.Dataset, idx []int, clip float64) (int, error) {
	d := e.dev
	d.mu.Lock()
	own := func(v []float32) bool {
		return slices.ContainsFunc(d.bufs, func(b []float32) bool { return len(v) > 0 && &b[0] == &v[0] })
	}
	if !own(dst) || !own(theta) || &dst[0] == &theta[0] {
		d.foreign++
	}
	d.mu.Unlock()
	return e.fakeEngine.ClippedSumIndexed(dst, theta, ds, idx, clip)
}

func (e *hostEngine) Close() error {
	d := e.dev
	d.mu.Lock()
	for _, b := range d.bufs {
		for i := range b {
			b[i] = float32(math.NaN())
		}
	}
	d.mu.Unlock()
	return e.fakeEngine.Close()
}

// TestEngineHostMemoryHoldsThetaAndSum: on an engine with host memory of
// its own (a GPU's page-locked memory), the node keeps its sum and every
// θ version there, so the engine moves them with no staging copy: three
// buffers for the whole run (the sum and two θ versions, reused as
// versions come and go), and the sums are the reference's bit for bit.
// When the engine refuses its memory, the node asks once and computes
// in Go memory, with the same sums.
func TestEngineHostMemoryHoldsThetaAndSum(t *testing.T) {
	const seed, steps = 11, 5
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused=%v", refuse), func(t *testing.T) {
			dev := &hostDevice{}
			if refuse {
				dev.allocErr = errors.New("out of page-locked memory")
			}
			fx := logregFixture(t)
			nc, lc := natsPair(t)
			l := newLeaderSide(t, lc)
			cfg := testConfig()
			cfg.SeededSampling, cfg.SamplingSeed, cfg.Device = true, seed, dev
			r := start(t, cfg, fx, nc)
			recv(t, l.joins, "join")
			l.announce("r1", 1)
			for step := uint64(1); step <= steps; step++ {
				l.params(step-1, 1, fx.theta)
				rs := fx.round(step, step, 1, wait)
				l.publish(rs)
				answersReference(t, fx, cfg, rs, recv(t, l.contribs, "contribution"))
			}
			r.cancel()
			if err := r.result(t); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v", err)
			}
			dev.mu.Lock()
			defer dev.mu.Unlock()
			wantAllocs, wantForeign := 1+maxParamsKept, 0
			if refuse {
				wantAllocs, wantForeign = 1, steps
			}
			if dev.allocs != wantAllocs || dev.foreign != wantForeign {
				t.Errorf("%d AllocHost calls and %d steps off the engine's memory, want %d and %d",
					dev.allocs, dev.foreign, wantAllocs, wantForeign)
			}
			if n := dev.closes.Load(); n != 1 {
				t.Errorf("engine closed %d times, want 1", n)
			}
		})
	}
}

package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
)

// countingDevice is a model.Device whose engines are CPU Workspaces that
// count their use, or whose NewEngine fails with err.
type countingDevice struct {
	err      error
	maxBatch int
	sums     int
	closes   int
}

func (d *countingDevice) Info() model.DeviceInfo {
	return model.DeviceInfo{ID: "fake:1", Name: "Fake Accelerator", MemoryBytes: 1 << 30, ComputeCapability: "8.0"}
}

func (d *countingDevice) NewEngine(m *model.Model, maxBatch int) (model.Engine, error) {
	d.maxBatch = maxBatch
	if d.err != nil {
		return nil, d.err
	}
	ws, err := m.NewWorkspace(maxBatch)
	if err != nil {
		return nil, err
	}
	return &countingEngine{Workspace: ws, dev: d}, nil
}

func (d *countingDevice) Close() error { return nil }

type countingEngine struct {
	*model.Workspace
	dev *countingDevice
}

func (e *countingEngine) ClippedSumIndexed(dst, theta []float32, d *dataset.Dataset, idx []int, clip float64) (int, error) {
	e.dev.sums++
	return e.Workspace.ClippedSumIndexed(dst, theta, d, idx, clip)
}

func (e *countingEngine) Close() error {
	e.dev.closes++
	return nil
}

// TestRunOnDevice: the CPU device gives the default run bit for bit; every
// step's sum is computed on Config.Device's engine, allocated once for
// ⌈1.25·B⌉ + 16 examples and released before Run returns; a device that
// cannot run the model fails before the first step, naming the layer.
func TestRunOnDevice(t *testing.T) {
	data := mixture(t, 600, 5, 3, 9)
	m, err := model.New(model.MLP([]int{5}, []int{8}, 3))
	if err != nil {
		t.Fatal(err)
	}
	run := func(dev model.Device) ([]float32, Result, error) {
		theta := make([]float32, m.NumParams())
		if err := m.Init(theta, 1); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Steps = 5
		cfg.Optimizer.ExpectedBatchSize = 60
		cfg.Device = dev
		s, err := sampling.NewSeededPoisson(0.1, 3)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(context.Background(), m, theta, data, nil, cfg, Sources{Noise: mechanism.NewSeededNoiseSource(1), Sampler: s}, nil)
		return theta, res, err
	}
	want, _, err := run(nil)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := model.OpenDevice("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	if got, _, err := run(cpu); err != nil || !slices.Equal(got, want) {
		t.Errorf("on OpenDevice(\"cpu\"): err %v, θ equal to the default run's: %v", err, slices.Equal(got, want))
	}

	counting := &countingDevice{}
	if got, res, err := run(counting); err != nil || res.Steps != 5 || !slices.Equal(got, want) {
		t.Errorf("on the counting device: err %v, %d steps, θ equal: %v", err, res.Steps, slices.Equal(got, want))
	}
	if counting.maxBatch != 91 || counting.sums != 5 || counting.closes != 1 {
		t.Errorf("engine of %d examples, %d sums, closed %d times; want 91 (⌈1.25·60⌉ + 16), 5, 1",
			counting.maxBatch, counting.sums, counting.closes)
	}

	failing := &countingDevice{err: fmt.Errorf("%w: layer 1 (relu)", model.ErrUnsupportedLayer)}
	got, res, err := run(failing)
	if !errors.Is(err, model.ErrUnsupportedLayer) || !strings.Contains(err.Error(), "layer 1 (relu)") ||
		!strings.Contains(err.Error(), "fake:1") {
		t.Fatalf("on a device without the layer: err = %v, want model.ErrUnsupportedLayer naming the layer and device", err)
	}
	init := make([]float32, m.NumParams())
	if err := m.Init(init, 1); err != nil {
		t.Fatal(err)
	}
	if res.Steps != 0 || !slices.Equal(got, init) {
		t.Errorf("a failed start took %d steps or changed θ", res.Steps)
	}
}

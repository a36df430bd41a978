package main

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
)

// TestNullEngine: the null engine's sum is deterministic, has the model's
// shape and norm at most count·C, and the engine checks its arguments as
// every engine does.
func TestNullEngine(t *testing.T) {
	m, err := model.New(model.MLP([]int{5}, []int{7}, 3))
	if err != nil {
		t.Fatal(err)
	}
	e, err := nullDevice{}.NewEngine(m, 4)
	if err != nil {
		t.Fatal(err)
	}
	d := &dataset.Dataset{Name: "t", Dim: 5, Classes: 3, X: make([]float32, 50), Y: make([]int32, 10)}
	theta := make([]float32, m.NumParams())
	for _, c := range []struct {
		idx  []int
		clip float64
	}{{[]int{0, 3, 3, 9}, 1}, {[]int{1}, 0.37}, {nil, 2}, {[]int{2, 4, 6, 8, 1, 0, 5}, 1e6}} {
		dst := make([]float32, m.NumParams())
		n, err := e.ClippedSumIndexed(dst, theta, d, c.idx, c.clip)
		if err != nil || n != len(c.idx) {
			t.Fatalf("n %d err %v", n, err)
		}
		var sq float64
		for _, v := range dst {
			sq += float64(v) * float64(v)
		}
		bound := float64(len(c.idx)) * c.clip
		if norm := math.Sqrt(sq); !(norm <= bound) || norm < bound*(1-1e-6) {
			t.Fatalf("%d examples, C %v: norm %v, want count·C = %v (at most, within 1e-6)", len(c.idx), c.clip, norm, bound)
		}
		again := make([]float32, m.NumParams())
		e.ClippedSumIndexed(again, theta, d, c.idx, c.clip)
		for j := range dst {
			if dst[j] != again[j] {
				t.Fatal("not deterministic")
			}
		}
	}
	dst := make([]float32, m.NumParams())
	if _, err := e.ClippedSumIndexed(dst, theta, d, []int{10}, 1); !errors.Is(err, model.ErrShape) {
		t.Fatalf("index out of range: %v", err)
	}
	if _, err := e.ClippedSumIndexed(dst[:3], theta, d, []int{1}, 1); !errors.Is(err, model.ErrShape) {
		t.Fatalf("short dst: %v", err)
	}
	if _, err := e.ClippedSumIndexed(dst, theta, d, []int{1}, math.NaN()); !errors.Is(err, model.ErrBadClip) {
		t.Fatalf("NaN clip: %v", err)
	}
}

// TestRunChild runs one configuration through the real path (local's
// embedded NATS, replica, ledger and in-process nodes) with the null
// engine and with the CPU engine, on the synthetic dataset, and checks that
// every field -json reports was measured.
func TestRunChild(t *testing.T) {
	for _, c := range []struct{ engine, want string }{{"null", "null"}, {"device", "cpu ("}} {
		t.Run(c.engine, func(t *testing.T) {
			f := flags{models: "mlp", nodes: "2", engine: c.engine, device: "cpu", dataset: "gaussian", steps: 4, warmup: 2,
				batch: 64, noise: "discrete", engineIters: 2, floorReps: 1}
			r, err := runChild(f)
			if err != nil {
				t.Fatal(err)
			}
			if r.Model != "mlp" || r.Nodes != 2 || !strings.HasPrefix(r.Engine, c.want) || r.Steps != 4 || r.Params != 269322 {
				t.Fatalf("result %+v", r)
			}
			for name, v := range map[string]float64{"step": r.StepMean, "compute": r.ComputeMax, "floor": r.FloorMS,
				"round": r.Collect, "commit": r.Commit, "engine": r.EngineDP, "peak RSS": float64(r.PeakRSS),
				"data dir": float64(r.DataDir)} {
				if !(v > 0) {
					t.Errorf("%s = %v, want > 0", name, v)
				}
			}
			// The data dir holds at least the Raft log's step entries (4·d bytes each).
			if r.DataDir < 4*int64(r.Params) {
				t.Errorf("data dir %d bytes, less than one step entry", r.DataDir)
			}
		})
	}
}

// TestRunChildBERT runs the small BERT-shaped encoder through the real
// path of a fine-tuning run (local --init-from a checkpoint of random
// weights, the frozen layers held once in the process's one model and
// shared by its nodes) in each setting, and checks what it reports
// against the model: the trainable parameters are the setting's, and
// the bytes per step are at least θ to every node and every node's sum
// back (4 bytes a value, k times each way), and less than half as much
// again (the transport's framing, the round's small messages, and on a
// loaded machine a retransmitted chunk or a transfer that straddles the
// measured steps' ends) — far below what one copy of the whole model
// would add in the last-block setting.
func TestRunChildBERT(t *testing.T) {
	skipUnderRace(t)
	if testing.Short() {
		t.Skip("a BERT-shaped run takes seconds")
	}
	fixture := t.TempDir()
	const seqLen = 16
	shape := bertShapes["bert-small"]
	h, v, ff, L := shape.Hidden, shape.Vocab, shape.Intermediate, shape.Layers
	block := 4*h*h + 4*h + 2*h*ff + ff + h + 4*h // attention (qkv, output), FFN, two layer norms
	head := h*h + h + h*bertClasses + bertClasses
	full := (v+shape.Positions+shape.Types)*h + 2*h + L*block + head
	const r = 2
	adapters := L * 2 * (r*h + h*r) // query and value in every block
	for _, c := range []struct {
		setting           string
		nodes             string
		trainable, params int
	}{{"full", "1", full, full}, {"last-block", "3", block + head, full},
		{"lora-r2", "1", adapters + h*bertClasses + bertClasses, full + adapters}} {
		t.Run(c.setting, func(t *testing.T) {
			f := flags{models: "bert-small", nodes: c.nodes, trainable: c.setting, seqLen: seqLen, fixture: fixture,
				roundTimeout: time.Minute, engine: "device", device: "cpu", steps: 2, warmup: 1, batch: 4,
				noise: "discrete", engineIters: 1, floorReps: 1}
			r, err := runChild(f)
			if err != nil {
				t.Fatal(err)
			}
			if r.Model != "bert-small" || r.Setting != c.setting || r.Params != c.params || r.TrainableParams != c.trainable {
				t.Fatalf("%s %s: %d of %d parameters train; want %d of %d", r.Model, r.Setting, r.TrainableParams, r.Params, c.trainable, c.params)
			}
			k := float64(r.Nodes)
			vectors := 2 * k * 4 * float64(c.trainable)
			if !(r.BytesPerStep >= vectors && r.BytesPerStep < 1.5*vectors+64<<10) {
				t.Fatalf("%.0f bytes per step; θ to %v nodes and their sums back are %.0f", r.BytesPerStep, k, vectors)
			}
			for name, v := range map[string]float64{"step": r.StepMean, "compute": r.ComputeMax, "engine": r.EngineDP, "floor": r.FloorMS} {
				if !(v > 0) {
					t.Errorf("%s = %v, want > 0", name, v)
				}
			}
		})
	}
}

package cli

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/internal/torchref"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/pretrained"
)

// pythonPackageDir is python/, the directory that holds the dpcluster
// Python package. It reads the package's files, so that go test's cache
// counts them among the test's inputs (it does not see what a
// subprocess reads).
func pythonPackageDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "dpcluster", "*.py"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Python package in %s (%v)", dir, err)
	}
	for _, f := range files {
		if _, err := os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// pyCase is one model the Python package is compared on.
type pyCase struct {
	name string
	spec model.Spec
	// tokens: the inputs are token ids below the vocabulary, some -1
	// (padding); sep, if ≥ 0, is an id put into every example.
	tokens bool
	sep    int
}

func mustPreset(t *testing.T, name string, input []int, classes, vocab int) model.Spec {
	t.Helper()
	s, err := model.PresetFor(name, input, classes, vocab)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pretrainedSpec is the engine spec of a tiny BERT or GPT-2 checkpoint's
// sequence classifier (package pretrained), as a fine-tuned run has.
func pretrainedSpec(t *testing.T, name string) model.Spec {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "checkpoint", "testdata", name, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	mp, err := pretrained.NewMapping(raw, pretrained.Options{SeqLen: 8, Classes: 3, SepID: 3})
	if err != nil {
		t.Fatal(err)
	}
	return mp.Model().Spec()
}

func parseSpecJSON(t *testing.T, s string) model.Spec {
	t.Helper()
	spec, err := model.ParseSpec([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// pyCases are every preset and JSON specs that cover every layer type and
// option of the CPU engine between them.
func pyCases(t *testing.T) []pyCase {
	return []pyCase{
		{name: "logreg", spec: mustPreset(t, "logreg", []int{1, 6, 5}, 4, 0)},
		{name: "mlp", spec: mustPreset(t, "mlp", []int{8}, 3, 0)},
		{name: "cnn", spec: mustPreset(t, "cnn", []int{3, 16, 16}, 5, 0)},
		{name: "textbag", spec: mustPreset(t, "textbag", []int{12}, 4, 50), tokens: true, sep: -1},
		{name: "transformer", spec: mustPreset(t, "transformer", []int{9}, 0, 40), tokens: true, sep: -1},
		{name: "transformer-classifier", spec: model.TransformerClassifier(30, 7, 16, 1, 2, 3), tokens: true, sep: -1},
		{name: "bert", spec: pretrainedSpec(t, "tiny-bert"), tokens: true, sep: 3},
		{name: "gpt2", spec: pretrainedSpec(t, "tiny-gpt2"), tokens: true, sep: -1},
		{name: "images", spec: parseSpecJSON(t, `{"name": "images", "input": [2, 9, 7], "classes": 3, "layers": [
			{"type": "conv2d", "name": "c1", "out": 4, "kernel": 3, "stride": 2, "pad": 1},
			{"type": "gelu"}, {"type": "avgpool", "kernel": 2, "stride": 1},
			{"type": "conv2d", "out": 3, "kernel": 2}, {"type": "relu"}, {"type": "maxpool", "kernel": 2},
			{"type": "flatten"}, {"type": "layernorm", "eps": 0.001}, {"type": "linear", "out": 6},
			{"type": "gelu_tanh"}, {"type": "linear", "name": "head", "out": 3, "no_bias": true}]}`)},
		{name: "sequence", spec: parseSpecJSON(t, `{"input": [6], "classes": 4, "layers": [
			{"type": "embedding", "vocab": 11, "dim": 8, "positions": 10, "pos_offset": 2, "types": 3, "type_sep": 5},
			{"type": "residual", "name": "block", "layers": [{"type": "layernorm"}, {"type": "linear", "out": 24},
				{"type": "attention", "heads": 4, "mask": "padding"}, {"type": "linear", "name": "proj", "out": 8}]},
			{"type": "residual", "layers": [{"type": "linear", "out": 24}, {"type": "attention", "heads": 2},
				{"type": "linear", "out": 8, "no_bias": true}]},
			{"type": "gelu"}, {"type": "lasttoken"}, {"type": "tanh"}, {"type": "linear", "out": 4}]}`), tokens: true, sep: 5},
	}
}

// pyInputs draws n examples for spec: values in [0, 1), or token ids
// with padding (a padded tail, one example all padding, one none) and,
// with sep ≥ 0, segment ends.
func pyInputs(c pyCase, m *model.Model, n int, rng *rand.Rand) []float32 {
	size := m.InputSize()
	x := make([]float32, n*size)
	if !c.tokens {
		for i := range x {
			x[i] = rng.Float32()
		}
		return x
	}
	vocab := vocabOf(m)
	for i := range n {
		ex := x[i*size : (i+1)*size]
		keep := size - i%(size+1) // example 0 has no padding; example size is all padding
		for j := range ex {
			switch {
			case j >= keep:
				ex[j] = -1
			case c.sep >= 0 && (j == keep/2 || j == keep-1):
				ex[j] = float32(c.sep)
			default:
				ex[j] = float32(rng.IntN(vocab))
			}
		}
		if i == n-1 && keep > 2 { // padding in the middle
			ex[1] = -1
		}
	}
	return x
}

// writeF32 writes v as raw little-endian float32 values.
func writeF32(t *testing.T, path string, v []float32) {
	t.Helper()
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// readF64 reads raw little-endian float64 values.
func readF64(t *testing.T, path string) []float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

// pyCompareScript runs the Python package on every case of a manifest:
// it loads the model, computes its logits with numpy (and, with torch,
// the torch module's in float64 and float32) and writes them raw, with
// the classes, features and input shape it read.
const pyCompareScript = `
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import dpcluster
cases = json.load(open(sys.argv[2]))
try:
    import torch
except ImportError:
    torch = None
report = {"torch": torch is not None, "cases": {}}
for c in cases:
    m = dpcluster.load(c["model"])
    x = np.fromfile(c["x"], dtype="<f4").reshape([c["n"]] + c["input"])
    m.logits(x).astype("<f8").tofile(c["out"] + ".numpy")
    if torch is not None:
        for name, dt in (("torch64", torch.float64), ("torch32", torch.float32)):
            with torch.no_grad():
                z = m.to_torch(dt)(torch.from_numpy(x.copy()))
            z.double().numpy().astype("<f8").tofile(c["out"] + "." + name)
    report["cases"][c["name"]] = {"classes": m.classes, "features": m.features, "input": list(m.input_shape),
                                  "predict": m.predict(x).tolist()}
json.dump(report, sys.stdout)
`

// TestPythonPackageMatchesEngine exports, for every preset and for JSON
// specs that cover every layer type of the CPU engine (BERT's and
// GPT-2's sequence classifiers among them, with padding), a model with
// random θ through the export path (writeModel), computes its logits with
// the engine (Workspace.Logits), and runs the Python package in python/
// on the same inputs: its numpy logits, and where PyTorch is importable
// its torch module's (float64 and float32), must match the engine's to
// 1e-4 of the largest logit, and it must read the class and feature
// names from the metadata. Skips only without a python3 that has numpy.
func TestPythonPackageMatchesEngine(t *testing.T) {
	py := torchref.RequireNumpy(t)
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 11))
	const n = 7
	type result struct {
		c      pyCase
		m      *model.Model
		logits []float32
		names  *coordinator.DataNames
	}
	var manifest []map[string]any
	var results []result
	for _, c := range pyCases(t) {
		m, err := model.New(c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		theta := make([]float32, m.NumParams())
		if err := m.Init(theta, rng.Uint64()); err != nil {
			t.Fatal(err)
		}
		for i := range theta { // layer norms' gains and biases away from 1 and 0
			theta[i] += float32(0.1 * rng.NormFloat64())
		}
		specJSON, err := m.Spec().CanonicalJSON()
		if err != nil {
			t.Fatal(err)
		}
		names := &coordinator.DataNames{}
		for k := range m.Classes() {
			names.Classes = append(names.Classes, "class "+string(rune('A'+k%26))+strings.Repeat("'", k/26))
		}
		if !c.tokens && len(m.InputShape()) == 1 {
			for j := range m.InputSize() {
				names.Features = append(names.Features, "f"+string(rune('a'+j)))
			}
		}
		cfg := coordinator.RunConfig{Run: "t-py-" + c.name, ModelSpec: specJSON, ModelHash: m.Hash(), Dim: m.NumParams(),
			TotalExamples: 1000, SampleRate: 0.1, TargetEpsilon: 1, Delta: 1e-5, NoiseMode: coordinator.NoiseFloat,
			Accountant: coordinator.AccountantRDP, Optimizer: dpadam.Config{NoiseMultiplier: 1, ClipNorm: 1, ExpectedBatchSize: 100},
			Names: names}
		path := filepath.Join(dir, c.name+".safetensors")
		if err := writeModel(coordinator.Committed{Config: cfg, Step: 3, Theta: theta, Epsilon: 0.5}, path); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		x := pyInputs(c, m, n, rng)
		ws, err := m.NewWorkspace(n)
		if err != nil {
			t.Fatal(err)
		}
		per := m.Classes() // a next-token model's: at each of its T = input − 1 positions
		if c.spec.Loss == model.NextToken {
			per *= m.InputSize() - 1
		}
		out := make([]float32, n*per)
		if err := ws.Logits(out, theta, x); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		xPath := filepath.Join(dir, c.name+".x")
		writeF32(t, xPath, x)
		manifest = append(manifest, map[string]any{"name": c.name, "model": path, "x": xPath, "n": n, "input": m.InputShape(),
			"out": filepath.Join(dir, c.name+".logits")})
		results = append(results, result{c: c, m: m, logits: out, names: names})
	}
	mb, _ := json.Marshal(manifest)
	manifestPath := filepath.Join(dir, "manifest.json")
	if err := os.WriteFile(manifestPath, mb, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", pyCompareScript, pythonPackageDir(t), manifestPath)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	var report struct {
		Torch bool `json:"torch"`
		Cases map[string]struct {
			Classes  []string `json:"classes"`
			Features []string `json:"features"`
			Input    []int    `json:"input"`
			Predict  []any    `json:"predict"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &report); err != nil {
		t.Fatalf("python's report: %v\n%s", err, raw)
	}
	engines := []string{"numpy"}
	if report.Torch {
		engines = append(engines, "torch64", "torch32")
	} else {
		t.Logf("%s has no PyTorch: the torch module is not compared", py)
	}
	for _, r := range results {
		name := r.c.name
		got := report.Cases[name]
		if !slices.Equal(got.Classes, r.names.Classes) || !slices.Equal(got.Features, r.names.Features) || !slices.Equal(got.Input, r.m.InputShape()) {
			t.Errorf("%s: python read classes %q, features %q, input %v; want %q, %q, %v",
				name, got.Classes, got.Features, got.Input, r.names.Classes, r.names.Features, r.m.InputShape())
		}
		var scale float64
		for _, v := range r.logits {
			scale = max(scale, math.Abs(float64(v)))
		}
		for _, eng := range engines {
			z := readF64(t, filepath.Join(dir, name+".logits."+eng))
			if len(z) != len(r.logits) {
				t.Errorf("%s (%s): %d logits, the engine's %d", name, eng, len(z), len(r.logits))
				continue
			}
			var worst float64
			for i, v := range r.logits {
				worst = max(worst, math.Abs(z[i]-float64(v)))
			}
			if !(worst <= 1e-4*scale) {
				t.Errorf("%s (%s): logits differ from the engine's by up to %.3g (largest logit %.3g)", name, eng, worst, scale)
			}
			t.Logf("%s (%s): max difference %.2g, largest logit %.3g", name, eng, worst, scale)
		}
	}
}

// TestPythonPackageUnitTests runs the Python package's own unit tests
// (python/tests: inputs by column name, hand-computed sequence layers,
// errors) with `python3 -m unittest` in python/.
func TestPythonPackageUnitTests(t *testing.T) {
	py := torchref.RequireNumpy(t)
	dir := pythonPackageDir(t)
	tests, err := filepath.Glob(filepath.Join(dir, "tests", "*.py"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests in %s/tests (%v)", dir, err)
	}
	for _, f := range tests { // go test's cache counts them as inputs
		if _, err := os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(py, "-m", "unittest", "-v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\nOK") || strings.Contains(string(out), "Ran 0 tests") {
		t.Fatalf("python3 -m unittest in %s: %v\n%s", dir, err, out)
	}
	t.Logf("%s", out)
}

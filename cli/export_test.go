package cli

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/internal/torchref"
	"github.com/dpcluster/dpcluster/model"
)

// readModelFile reads a safetensors file written by exportModel back with
// model.ReadSafetensors (which checks every name, dtype and shape against
// the spec in its metadata) and returns the model, θ and the metadata.
func readModelFile(t *testing.T, path string) (*model.Model, []float32, map[string]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The spec comes from the file's own metadata: parse the header first.
	var hl uint64
	for i := range 8 {
		hl |= uint64(b[i]) << (8 * i)
	}
	var header struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(b[8:8+hl], &header); err != nil {
		t.Fatal(err)
	}
	spec, err := model.ParseSpec([]byte(header.Meta["spec"]))
	if err != nil {
		t.Fatalf("metadata spec: %v", err)
	}
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	theta, meta, err := m.ReadSafetensors(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return m, theta, meta
}

// treeState maps every path under dir to its size, mtime and mode.
func treeState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fmtState(info)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fmtState(fi fs.FileInfo) string {
	return strconv.FormatInt(fi.Size(), 10) + " " + fi.ModTime().Format(time.RFC3339Nano) + " " + fi.Mode().String()
}

// TestLocalWritesModelAndExport runs a short `coordinator local`, which
// leaves model.safetensors in its data dir: θ in it is the θ the run ended
// with (its state_sha256 metadata is the digest of the replica that ran,
// and export recomputes that digest from the replayed state), with the
// run's step, ε, δ, accountant, privacy and spec. `coordinator export`
// on the same dir writes the same bytes and leaves the dir untouched;
// it refuses a missing or empty dir.
func TestLocalWritesModelAndExport(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, localArgs(dir)...)
	if err != nil {
		t.Fatal(err)
	}
	var res localResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if res.Model != filepath.Join(dir, ModelFile) || res.StateSHA256 == "" {
		t.Fatalf("result %+v", res)
	}
	m, theta, meta := readModelFile(t, res.Model)
	want := map[string]string{
		"run": "t-local", "step": "40", "epsilon": strconv.FormatFloat(res.Epsilon, 'g', -1, 64),
		"delta": strconv.FormatFloat(res.Delta, 'g', -1, 64), "accountant": "pld", "private": "true",
		"state_sha256": res.StateSHA256, "noise_mode": res.NoiseMode, "format": "pt", "spec_sha256": m.Hash(),
	}
	for k, v := range want {
		if meta[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, meta[k], v)
		}
	}
	if !strings.Contains(meta["privacy_event"], `"poisson_sampled"`) {
		t.Errorf("privacy_event %q", meta["privacy_event"])
	}
	if m.Spec().Name != "logreg" || len(theta) != m.NumParams() {
		t.Errorf("model %s with %d parameters", m.Spec().Name, len(theta))
	}
	for _, p := range m.Params() {
		if !strings.HasSuffix(p.Name, ".weight") && !strings.HasSuffix(p.Name, ".bias") {
			t.Errorf("parameter name %q", p.Name)
		}
	}

	exported := filepath.Join(t.TempDir(), "exported.safetensors")
	before := treeState(t, dir)
	eout, err := run(t, "export", dir, "--out", exported)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(eout, "step 40") {
		t.Errorf("export said %q", eout)
	}
	if after := treeState(t, dir); len(after) != len(before) {
		t.Errorf("export changed the data dir: %d paths before, %d after", len(before), len(after))
	} else {
		for p, s := range before {
			if after[p] != s {
				t.Errorf("export touched %s: %s → %s", p, s, after[p])
			}
		}
	}
	a, _ := os.ReadFile(res.Model)
	b, _ := os.ReadFile(exported)
	if !bytes.Equal(a, b) {
		t.Error("export wrote other bytes than the run's model.safetensors")
	}

	empty := t.TempDir()
	for _, d := range []string{filepath.Join(empty, "missing"), empty} {
		_, err := run(t, "export", d, "--out", filepath.Join(t.TempDir(), "x.safetensors"))
		if err == nil || !strings.Contains(err.Error(), "no replica state") {
			t.Errorf("export %s: %v, want a no-replica-state error", d, err)
		}
	}
	if _, err := run(t, "export", dir, "--out", exported, "--format", "onnx"); err == nil {
		t.Error("--format onnx accepted")
	}
}

// fashionScript classifies Fashion-MNIST's t10k set (IDX files, pixels
// divided by 255 as training reads them) with the Python package.
const fashionScript = `
import gzip, os, struct, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import dpcluster
def idx(path):
    data = gzip.decompress(open(path, "rb").read())
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
m = dpcluster.load(sys.argv[2])
images = idx(os.path.join(sys.argv[3], "t10k-images-idx3-ubyte.gz"))
labels = idx(os.path.join(sys.argv[3], "t10k-labels-idx1-ubyte.gz"))
pred = m.predict(images.astype(np.float32) / 255)
print(f"correct {int(np.sum(pred == labels))} of {len(labels)}")
`

// inCI reports whether the tests run under .ci/run, which installs every
// optional dependency: there, a missing one is a failure, not a skip.
func inCI() bool { return os.Getenv("DPCLUSTER_CI") != "" }

// TestPythonPackageMatchesEvaluation trains the mlp preset on
// Fashion-MNIST for a few steps with `coordinator local`, then classifies
// the t10k test set with the Python package in python/ (numpy only) on
// the model.safetensors the run wrote: its accuracy equals the
// coordinator's own final evaluation of the same θ. Both take the argmax
// of the same logits, but the package computes them in float64 and the
// coordinator in float32 (model.Workspace), so an example whose top two
// logits are within rounding error of each other may flip: the counts may
// differ by at most one example (in practice they are equal).
func TestPythonPackageMatchesEvaluation(t *testing.T) {
	skipUnderRace(t)
	py := torchref.PythonWith("numpy")
	if _, err := os.Stat(filepath.Join(dataset.DebianFashionMNISTDir, "t10k-images-idx3-ubyte.gz")); err != nil || py == "" {
		if inCI() {
			t.Fatalf("DPCLUSTER_CI is set but python3 with numpy (%q) or the Fashion-MNIST files (%v) are missing", py, err)
		}
		t.Skip("needs python3 with numpy and /usr/share/datasets/fashion-mnist (apt-get install python3-numpy dataset-fashion-mnist); never skipped in CI")
	}
	if testing.Short() {
		t.Skip("trains on Fashion-MNIST")
	}
	dir := t.TempDir()
	out, err := run(t, "local", "--dataset", "fashion-mnist", "--model", "mlp", "--batch-size", "128",
		"--max-steps", "30", "--eval-every", "0", "--round-timeout", "60s", "--nodes", "2",
		"--data-dir", dir, "--progress", "off", "--run", "t-py", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res localResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if res.TestAccuracy == nil || res.TestExamples == nil {
		t.Fatalf("no test evaluation: %+v", res)
	}
	cmd := exec.Command(py, "-c", fashionScript, pythonPackageDir(t), res.Model, dataset.DebianFashionMNISTDir)
	pout, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, pout)
	}
	mt := regexp.MustCompile(`(?m)^correct (\d+) of (\d+)$`).FindSubmatch(pout)
	if mt == nil {
		t.Fatalf("no result line in\n%s", pout)
	}
	correct, _ := strconv.Atoi(string(mt[1]))
	n, _ := strconv.Atoi(string(mt[2]))
	goCorrect := int(math.Round(*res.TestAccuracy * float64(*res.TestExamples)))
	if n != *res.TestExamples || correct < goCorrect-1 || correct > goCorrect+1 {
		t.Errorf("python: %d of %d correct; coordinator: %d of %d", correct, n, goCorrect, *res.TestExamples)
	}
	if !(*res.TestAccuracy > 0.3) {
		t.Errorf("test accuracy %v after 30 steps: the model did not train", *res.TestAccuracy)
	}
	t.Logf("python %d/%d, coordinator %d/%d\n%s", correct, n, goCorrect, *res.TestExamples, pout)
}

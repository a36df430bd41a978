package pretrained

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/internal/torchref"
)

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// conformanceBatch is the test's padded batch of T = 12 tokens (-1 is
// padding), rows of 12, 9, 5 and 1 tokens; sep is BERT's [SEP], which
// splits the first two rows into pairs.
func conformanceBatch(sep int) [][]int {
	return [][]int{
		{2, 17, 33, 4, sep, 8, 51, 23, 9, 40, 11, sep},
		{2, 5, 44, sep, 30, 12, 19, 7, sep, -1, -1, -1},
		{2, 50, 3, 28, sep, -1, -1, -1, -1, -1, -1, -1},
		{2, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
	}
}

// TestPyTorchConformance checks the imported BERT and GPT-2 models against
// the same models written in plain PyTorch with Hugging Face's parameter
// names (testdata/torchref.py, computing in float64), from a checkpoint
// the PyTorch side writes with random weights: the logits of a padded
// batch within 1e-4 of the largest, and each example's gradient (every
// parameter, through the inverse mapping) within 1e-4 of its largest
// entry. Then θ, moved as training would move it, is exported and loaded
// back by PyTorch, which must compute our engine's logits.
func TestPyTorchConformance(t *testing.T) {
	py := torchref.Require(t)
	for _, arch := range []string{"bert", "gpt2"} {
		t.Run(arch, func(t *testing.T) {
			dir := t.TempDir()
			// Weights large enough that a wrong scaling, layer-norm ε or
			// GELU form moves the logits past the tolerance (with
			// transformers' 0.02 they would not).
			torchref.Run(t, py, "init", "--arch", arch, "--out", dir, "--seed", "7", "--std", "0.3", "--embed-std", "0.03",
				"--labels", "3", "--vocab", "60", "--hidden", "16", "--layers", "2", "--heads", "2", "--intermediate", "64", "--max-positions", "16")
			var cfg struct {
				Sep int `json:"sep_token_id"`
			}
			if err := json.Unmarshal(mustRead(t, filepath.Join(dir, ConfigFile)), &cfg); err != nil {
				t.Fatal(err)
			}
			var vocab strings.Builder
			for id := range 60 {
				if id == cfg.Sep {
					vocab.WriteString("[SEP]\n")
				} else {
					fmt.Fprintf(&vocab, "tok%d\n", id)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte(vocab.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			rows := conformanceBatch(cfg.Sep)
			labels := []int{0, 2, 1, 0}
			idsPath, labelsPath, refPath := filepath.Join(dir, "ids.json"), filepath.Join(dir, "labels.json"), filepath.Join(dir, "ref.safetensors")
			writeJSON(t, idsPath, rows)
			writeJSON(t, labelsPath, labels)
			torchref.Run(t, py, "forward", "--dir", dir, "--ids", idsPath, "--labels", labelsPath, "--out", refPath, "--out-dtype", "F64")

			ck, err := Open(dir, Options{SeqLen: 12, Classes: 3})
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if len(ck.Report.Fresh) != 0 {
				t.Errorf("newly initialized %v: the checkpoint has every tensor", ck.Report.Fresh)
			}
			m := ck.Model()
			theta := make([]float32, m.NumParams())
			if err := ck.Init(theta, 1); err != nil {
				t.Fatal(err)
			}
			ws, err := m.NewWorkspace(len(rows))
			if err != nil {
				t.Fatal(err)
			}
			var x []float32
			for _, r := range rows {
				for _, id := range r {
					x = append(x, float32(id))
				}
			}
			ref, err := checkpoint.Open(refPath)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			read := func(name string, n int) []float32 {
				v := make([]float32, n)
				if err := ref.ReadFloat32(name, v); err != nil {
					t.Fatal(err)
				}
				return v
			}
			logits := make([]float32, 3*len(rows))
			if err := ws.Logits(logits, theta, x); err != nil {
				t.Fatal(err)
			}
			d := relDiff(logits, read("logits", len(logits)))
			if d > 1e-4 {
				t.Errorf("logits differ from PyTorch's by %.3g of the largest", d)
			}
			t.Logf("logits: largest difference %.3g of the largest logit", d)
			for i := range rows {
				g := make([]float32, m.NumParams())
				if _, err := ws.MeanGrad(g, theta, x[i*12:(i+1)*12], []int32{int32(labels[i])}); err != nil {
					t.Fatal(err)
				}
				tensors, err := ck.Tensors(g)
				if err != nil {
					t.Fatal(err)
				}
				var ours, theirs []float32
				for _, tn := range tensors {
					ours = append(ours, tn.Data...)
					theirs = append(theirs, read(fmt.Sprintf("grad.%d.%s", i, tn.Name), len(tn.Data))...)
				}
				d := relDiff(ours, theirs)
				if d > 1e-4 {
					t.Errorf("example %d: the gradient differs from PyTorch's per-example autograd by %.3g of its largest entry", i, d)
				}
				t.Logf("example %d: gradient's largest difference %.3g of its largest entry", i, d)
			}

			// Training moves θ; the export of the moved θ, loaded by
			// PyTorch, must give the logits our engine gives.
			for j := range theta {
				theta[j] += 0.01 * float32(math.Sin(float64(j)))
			}
			if err := ws.Logits(logits, theta, x); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "export")
			if err := ck.Export(out, theta, nil, nil); err != nil {
				t.Fatal(err)
			}
			ours := filepath.Join(t.TempDir(), "ours.safetensors")
			f, err := os.Create(ours)
			if err != nil {
				t.Fatal(err)
			}
			if err := WriteSafetensors(f, []Tensor{{Name: "logits", Shape: []int{len(rows), 3}, Data: logits}}, nil); err != nil {
				t.Fatal(err)
			}
			f.Close()
			torchref.Run(t, py, "load-check", "--dir", out, "--ids", idsPath, "--expect", ours)
		})
	}
}

// relDiff returns max |a−b| / max(max |b|, 1e-6).
func relDiff(a, b []float32) float64 {
	var d, s float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		s = max(s, math.Abs(float64(b[i])))
	}
	return d / max(s, 1e-6)
}

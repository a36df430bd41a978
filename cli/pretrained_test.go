package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/internal/torchref"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/pretrained"
)

// topicWords are the words of the test's two fortune categories.
var topicWords = map[string][]string{
	"science": {"atom", "energy", "quark", "photon"},
	"food":    {"bread", "cheese", "apple", "soup"},
}

// fortuneDir writes a fortunes folder of two categories, 60 fortunes
// each, each fortune three of its category's words.
func fortuneDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for cat, words := range topicWords {
		var b strings.Builder
		for i := range 60 {
			fmt.Fprintf(&b, "%s %s %s\n%%\n", words[i%4], words[(i+1)%4], words[(i+2)%4])
		}
		if err := os.WriteFile(filepath.Join(dir, cat), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// tinyCheckpoint copies the checkpoint package's tiny BERT (24 tokens,
// width 8, 2 blocks, 16 positions) and gives it a WordPiece vocabulary of
// its 24 tokens holding the test's words.
func tinyCheckpoint(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{pretrained.ConfigFile, pretrained.WeightsFile} {
		b, err := os.ReadFile(filepath.Join("..", "checkpoint", "testdata", name, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vocab := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]"}
	for _, cat := range []string{"science", "food"} {
		vocab = append(vocab, topicWords[cat]...)
	}
	for len(vocab) < 24 {
		vocab = append(vocab, fmt.Sprintf("filler%d", len(vocab)))
	}
	if err := os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte(strings.Join(vocab, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLocalInitFromCheckpoint fine-tunes a checkpoint end to end through
// the command: local imports it (its tokenizer tokenizes the fortunes),
// trains, and writes the fine-tuned model in the checkpoint's format;
// export rebuilds the same from the data dir given the checkpoint, and
// refuses without it or with other weights.
func TestLocalInitFromCheckpoint(t *testing.T) {
	ckpt := tinyCheckpoint(t, "tiny-bert")
	data := t.TempDir()
	res := localJSON(t, []string{"local", "--init-from", ckpt, "--dataset", "fortunes-category", "--data", fortuneDir(t),
		"--seq-len", "8", "--batch-size", "20", "--max-steps", "30", "--target-epsilon", "8", "--lr", "0.005",
		"--eval-every", "0", "--round-timeout", "20s", "--data-dir", data, "--progress", "off"})
	if res["run"] != "fortunes-category-"+filepath.Base(ckpt) || res["steps"] != float64(30) {
		t.Fatalf("run %v, %v steps", res["run"], res["steps"])
	}
	// How well a checkpoint of random weights learns the categories in
	// 30 steps varies from run to run; that it trains, evaluates and
	// changes the weights is what this test checks.
	if loss, _ := res["test_loss"].(float64); !(loss > 0) || math.IsInf(loss, 0) {
		t.Errorf("test loss %v: want a finite evaluation of the fine-tuned model", res["test_loss"])
	}
	fine := filepath.Join(data, FinetunedDir)
	if res["finetuned"] != fine {
		t.Errorf("result names the fine-tuned model %v, want %s", res["finetuned"], fine)
	}
	cfg, err := checkpoint.ReadConfig(fine)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Architectures, []string{"BertForSequenceClassification"}) || cfg.NumLabels != 2 {
		t.Errorf("fine-tuned config: %v, %d labels", cfg.Architectures, cfg.NumLabels)
	}
	// Every tensor the checkpoint had is there, and training moved the
	// ones it uses.
	before := readTensors(t, filepath.Join(ckpt, pretrained.WeightsFile))
	after := readTensors(t, filepath.Join(fine, pretrained.WeightsFile))
	for _, name := range []string{"bert.pooler.dense.weight", "bert.encoder.layer.1.output.dense.weight"} {
		if _, ok := after[name]; !ok {
			t.Fatalf("the fine-tuned model lacks %s", name)
		}
		if slices.Equal(before[name], after[name]) {
			t.Errorf("%s did not change in training", name)
		}
	}
	if _, ok := after["classifier.weight"]; !ok {
		t.Error("the fine-tuned model lacks its classifier")
	}

	// export reads θ from the replica's snapshot: the checkpoint is not
	// needed, but one given must be the run's.
	out := filepath.Join(t.TempDir(), "export")
	other := tinyCheckpoint(t, "tiny-bert")
	w := filepath.Join(other, pretrained.WeightsFile)
	b, err := os.ReadFile(w)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1 // another value in the last tensor: other weights
	writeFile(t, w, string(b))
	if _, _, err := runCmd(t, "export", data, "--out", out, "--init-from", other); err == nil || !strings.Contains(err.Error(), "not the same checkpoint") {
		t.Errorf("export with other weights: %v, want them refused", err)
	}
	if _, _, err := runCmd(t, "export", data, "--out", out); err != nil {
		t.Fatal(err)
	}
	exported := readTensors(t, filepath.Join(out, pretrained.WeightsFile))
	if len(exported) != len(after) {
		t.Errorf("export has %d tensors, the run's folder %d", len(exported), len(after))
	}
	for name, v := range after {
		if !slices.Equal(exported[name], v) {
			t.Errorf("%s: export differs from the run's fine-tuned model", name)
		}
	}
}

// readTensors reads every float tensor of a safetensors file.
func readTensors(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	f, err := checkpoint.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for _, ti := range f.Tensors() {
		if !ti.DType.Float() {
			continue
		}
		v := make([]float32, ti.Len())
		if err := f.ReadFloat32(ti.Name, v); err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = v
	}
	return out
}

// TestInitFromRefusesBadCheckpoints: each bad checkpoint is a one-line
// error, found by the checks before any data loads.
func TestInitFromRefusesBadCheckpoints(t *testing.T) {
	cases := []struct {
		name string
		edit func(t *testing.T, dir string)
		want string
	}{
		{"no config.json", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, pretrained.ConfigFile)) }, "no config.json"},
		{"unknown architecture", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, pretrained.ConfigFile), `{"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}`)
		}, `model_type "t5" is not a supported model`},
		{"truncated weights", func(t *testing.T, dir string) {
			p := filepath.Join(dir, pretrained.WeightsFile)
			b, _ := os.ReadFile(p)
			writeFile(t, p, string(b[:len(b)/2]))
		}, "model.safetensors"},
		{"wrong shape", func(t *testing.T, dir string) {
			// The config says 3 blocks' worth of positions fewer: the
			// file's position table no longer fits.
			p := filepath.Join(dir, pretrained.ConfigFile)
			b, _ := os.ReadFile(p)
			writeFile(t, p, strings.Replace(string(b), `"max_position_embeddings": 16`, `"max_position_embeddings": 12`, 1))
		}, "bert.embeddings.position_embeddings.weight is [16 8], want [12 8]"},
		{"tokenizer larger than the vocabulary", func(t *testing.T, dir string) {
			b := strings.Builder{}
			b.WriteString("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
			for i := range 27 {
				fmt.Fprintf(&b, "t%d\n", i)
			}
			writeFile(t, filepath.Join(dir, "vocab.txt"), b.String())
		}, "31 tokens, more than the 24 rows"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := tinyCheckpoint(t, "tiny-bert")
			c.edit(t, dir)
			_, _, err := runCmd(t, "local", "--init-from", dir, "--dataset", "fortunes-category", "--data", fortuneDir(t),
				"--seq-len", "8", "--max-steps", "5", "--data-dir", t.TempDir(), "--progress", "off")
			if err == nil {
				t.Fatal("accepted")
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, c.want) || !strings.Contains(msg, "--init-from") && !strings.Contains(msg, "--tokenizer") {
				t.Errorf("error %q: want one line naming the flag and %q", msg, c.want)
			}
		})
	}
	// A model preset beside --init-from is a contradiction.
	_, _, err := runCmd(t, "local", "--init-from", tinyCheckpoint(t, "tiny-bert"), "--model", "mlp", "--dataset", "fortunes-category",
		"--data-dir", t.TempDir(), "--progress", "off")
	if err == nil || !strings.Contains(err.Error(), "leave out --model") {
		t.Errorf("--model with --init-from: %v", err)
	}
}

// TestFineTunedLoadsInPyTorch is the whole path a PyTorch user takes: a
// BERT checkpoint written by the reference model in plain PyTorch
// (pretrained/testdata/torchref.py) is imported, fine-tuned with local on
// fortunes-category, exported with coordinator export, and the export,
// loaded back into the PyTorch model, gives the logits our engine gives
// with the run's θ (read from the run's own model file, in the engine's
// names, so the check does not go through the mapping it checks).
func TestFineTunedLoadsInPyTorch(t *testing.T) {
	py := torchref.Require(t)
	ckpt := t.TempDir()
	torchref.Run(t, py, "init", "--arch", "bert", "--out", ckpt, "--seed", "3", "--std", "0.3", "--embed-std", "0.03",
		"--labels", "2", "--vocab", "24", "--hidden", "16", "--layers", "2", "--heads", "2", "--intermediate", "32", "--max-positions", "16", "--sep", "3")
	// tinyCheckpoint's vocabulary: [SEP] is id 3.
	vocab, err := os.ReadFile(filepath.Join(tinyCheckpoint(t, "tiny-bert"), "vocab.txt"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ckpt, "vocab.txt"), string(vocab))
	data := t.TempDir()
	localJSON(t, []string{"local", "--init-from", ckpt, "--dataset", "fortunes-category", "--data", fortuneDir(t),
		"--seq-len", "8", "--batch-size", "20", "--max-steps", "20", "--target-epsilon", "8", "--lr", "0.005",
		"--eval-every", "0", "--round-timeout", "20s", "--data-dir", data, "--progress", "off"})
	out := filepath.Join(t.TempDir(), "export")
	if _, _, err := runCmd(t, "export", data, "--out", out, "--init-from", ckpt); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(data, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := checkpoint.NewFile(f, fileSize(t, f))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := model.ParseSpec([]byte(st.Metadata()["spec"]))
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	theta, _, err := m.ReadSafetensors(f)
	if err != nil {
		t.Fatal(err)
	}
	rows := [][]int{{2, 4, 5, 6, 3, -1, -1, -1}, {2, 8, 9, 3, 10, 11, 3, -1}, {2, 7, 3, -1, -1, -1, -1, -1}}
	var x []float32
	for _, r := range rows {
		for _, id := range r {
			x = append(x, float32(id))
		}
	}
	ws, err := m.NewWorkspace(len(rows))
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, 2*len(rows))
	if err := ws.Logits(logits, theta, x); err != nil {
		t.Fatal(err)
	}
	ids, expect := filepath.Join(t.TempDir(), "ids.json"), filepath.Join(t.TempDir(), "ours.safetensors")
	b, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, ids, string(b))
	ef, err := os.Create(expect)
	if err != nil {
		t.Fatal(err)
	}
	if err := pretrained.WriteSafetensors(ef, []pretrained.Tensor{{Name: "logits", Shape: []int{len(rows), 2}, Data: logits}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := ef.Close(); err != nil {
		t.Fatal(err)
	}
	torchref.Run(t, py, "load-check", "--dir", out, "--ids", ids, "--expect", expect)
}

func fileSize(t *testing.T, f *os.File) int64 {
	t.Helper()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestInitFuncPretrained: a replica rebuilding θ₀ of a run started from a
// checkpoint (no snapshot to start from) needs the checkpoint, refuses
// other weights naming both hashes, and reads θ₀ as the import does.
func TestInitFuncPretrained(t *testing.T) {
	ckpt := tinyCheckpoint(t, "tiny-bert")
	ck, err := pretrained.Open(ckpt, pretrained.Options{SeqLen: 8, Classes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	spec, err := ck.Spec().CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	rc := coordinator.RunConfig{ModelSpec: spec, ModelHash: ck.Model().Hash(), InitSeed: 5,
		Pretrained: &coordinator.Pretrained{WeightsSHA256: ck.WeightsSHA256, Config: ck.ConfigJSON}}
	if _, err := initFunc("", nil, nil)(rc); !errors.Is(err, errNeedsInitFrom) || !strings.Contains(err.Error(), ck.WeightsSHA256) {
		t.Errorf("without the checkpoint: %v, want errNeedsInitFrom naming the weights", err)
	}
	other := tinyCheckpoint(t, "tiny-bert")
	w := filepath.Join(other, pretrained.WeightsFile)
	b, err := os.ReadFile(w)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	writeFile(t, w, string(b))
	if _, err := initFunc(other, nil, nil)(rc); err == nil || !strings.Contains(err.Error(), ck.WeightsSHA256) || !strings.Contains(err.Error(), "not the same checkpoint") {
		t.Errorf("other weights: %v, want both hashes refused", err)
	}
	theta, err := initFunc(ckpt, nil, nil)(rc)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float32, len(theta))
	if err := ck.Init(want, 5); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(theta, want) {
		t.Error("θ₀ differs from the checkpoint's import")
	}
}

package pretrained

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/model"
)

// fixture copies the checkpoint package's tiny checkpoint folder name
// (written by checkpoint/testdata/make_fixtures.py) into a temporary
// folder, with a BERT vocabulary whose [SEP] is id 3, and returns it.
func fixture(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("..", "checkpoint", "testdata", name)
	dir := t.TempDir()
	for _, f := range []string{ConfigFile, WeightsFile} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vocab := "[PAD]\n[UNK]\n[CLS]\n[SEP]\n"
	for i := 4; i < 24; i++ {
		vocab += "w" + string(rune('a'+i)) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte(vocab), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBindingsCoverEveryTensor checks the mapping both ways: every engine
// parameter is filled by its parts exactly (sizes add up), and every
// parameter the checkpoint's model has (checkpoint.Expected, less
// buffers and tied tensors) is exactly one part of one engine parameter.
func TestBindingsCoverEveryTensor(t *testing.T) {
	for _, name := range []string{"tiny-bert", "tiny-gpt2"} {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "checkpoint", "testdata", name, ConfigFile))
			if err != nil {
				t.Fatal(err)
			}
			mp, err := NewMapping(raw, Options{SeqLen: 8, Classes: 3, SepID: 3})
			if err != nil {
				t.Fatal(err)
			}
			size := map[string]int{}
			for _, e := range mp.Expected() {
				if !e.Buffer && e.TiedTo == "" {
					size[e.Name] = e.Len()
				}
			}
			seen := map[string]bool{}
			bound := map[string]bool{}
			for _, b := range mp.plan.bindings {
				total := 0
				for _, p := range b.parts {
					n, ok := size[p]
					if !ok {
						t.Errorf("%s binds %s, which the checkpoint's model does not have", b.param, p)
					}
					if seen[p] {
						t.Errorf("%s is bound twice", p)
					}
					seen[p] = true
					total += n
				}
				v, ok := mp.model.Param(make([]float32, mp.model.NumParams()), b.param)
				if !ok {
					t.Fatalf("binding of %s: no such engine parameter", b.param)
				}
				if total != len(v) {
					t.Errorf("%s has %d values, its parts %v %d", b.param, len(v), b.parts, total)
				}
				bound[b.param] = true
			}
			for n := range size {
				if !seen[n] {
					t.Errorf("the checkpoint's %s is not bound", n)
				}
			}
			for _, p := range mp.model.Params() {
				if !bound[p.Name] {
					t.Errorf("engine parameter %s is not bound", p.Name)
				}
			}
		})
	}
}

// TestImportAndExportRoundTrip imports the fixtures (BERT with a
// pre-training head, whose cls.* tensors the classifier does not use and
// whose classifier is new; GPT-2 saved bare, in BF16, with Conv1D weights
// [in, out]), checks θ₀ against the file tensor by tensor through the
// inverse mapping, exports it, and imports the export: the same θ, and a
// config.json of the classification model.
func TestImportAndExportRoundTrip(t *testing.T) {
	cases := []struct {
		name, arch string
		fresh      []string
	}{
		{"tiny-bert", "BertForSequenceClassification", []string{"classifier.weight", "classifier.bias"}},
		{"tiny-gpt2", "GPT2ForSequenceClassification", []string{"score.weight"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := fixture(t, c.name)
			ck, err := Open(dir, Options{SeqLen: 8, Classes: 3})
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if !slices.Equal(ck.Report.Fresh, c.fresh) {
				t.Errorf("newly initialized %v, want %v", ck.Report.Fresh, c.fresh)
			}
			if len(ck.WeightsSHA256) != 64 {
				t.Errorf("weights hash %q", ck.WeightsSHA256)
			}
			theta := make([]float32, ck.Model().NumParams())
			if err := ck.Init(theta, 7); err != nil {
				t.Fatal(err)
			}
			tensors, err := ck.Tensors(theta)
			if err != nil {
				t.Fatal(err)
			}
			f, err := checkpoint.Open(filepath.Join(dir, WeightsFile))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			file := map[string]string{}
			for _, s := range ck.Report.Present {
				file[s.Name] = s.File
			}
			for _, tn := range tensors {
				name, ok := file[tn.Name]
				if !ok {
					if !slices.Contains(c.fresh, tn.Name) {
						t.Errorf("%s is neither read nor new", tn.Name)
					}
					continue
				}
				want := make([]float32, len(tn.Data))
				if err := f.ReadFloat32(name, want); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(tn.Data, want) {
					t.Errorf("%s: θ₀ through the inverse mapping differs from the file", tn.Name)
				}
			}
			out := filepath.Join(t.TempDir(), "out")
			if err := ck.Export(out, theta, []string{"a", "b", "c"}, map[string]string{"run": "x"}); err != nil {
				t.Fatal(err)
			}
			cfg, err := checkpoint.ReadConfig(out)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Architectures, []string{c.arch}) || cfg.NumLabels != 3 || !slices.Equal(cfg.Labels, []string{"a", "b", "c"}) {
				t.Errorf("exported config: architectures %v, %d labels %v", cfg.Architectures, cfg.NumLabels, cfg.Labels)
			}
			if err := os.WriteFile(filepath.Join(out, "vocab.txt"), mustRead(t, filepath.Join(dir, "vocab.txt")), 0o644); err != nil {
				t.Fatal(err)
			}
			back, err := Open(out, Options{SeqLen: 8, Classes: 3})
			if err != nil {
				t.Fatal(err)
			}
			defer back.Close()
			if len(back.Report.Fresh) != 0 || len(back.Report.Unexpected) != 0 {
				t.Errorf("the export, imported: new %v, unexpected %v; want every tensor read and none left", back.Report.Fresh, back.Report.Unexpected)
			}
			theta2 := make([]float32, len(theta))
			if err := back.Init(theta2, 99); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(theta, theta2) {
				t.Error("θ exported and imported again differs")
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGPT2ConvTransposed checks one Conv1D weight by hand: the engine's
// c_attn weight [3E, E] at (o, i) is the file's [E, 3E] at (i, o).
func TestGPT2ConvTransposed(t *testing.T) {
	dir := fixture(t, "tiny-gpt2")
	ck, err := Open(dir, Options{SeqLen: 8, Classes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	theta := make([]float32, ck.Model().NumParams())
	if err := ck.Init(theta, 1); err != nil {
		t.Fatal(err)
	}
	w, ok := ck.Model().Param(theta, "h.0.attn.c_attn.weight")
	if !ok {
		t.Fatal("no h.0.attn.c_attn.weight")
	}
	f, err := checkpoint.Open(filepath.Join(dir, WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	file := make([]float32, 8*24)
	if err := f.ReadFloat32("h.0.attn.c_attn.weight", file); err != nil {
		t.Fatal(err)
	}
	for o := range 24 {
		for i := range 8 {
			if w[o*8+i] != file[i*24+o] {
				t.Fatalf("engine weight (%d, %d) = %v, file (%d, %d) = %v", o, i, w[o*8+i], i, o, file[i*24+o])
			}
		}
	}
}

// TestOpenRefusesBadCheckpoints: each bad input is one line naming the
// problem, before any weight is read.
func TestOpenRefusesBadCheckpoints(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(t *testing.T, dir string)
		opt   Options
		wants []string
		is    error
	}{
		{"no config.json", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, ConfigFile)) },
			Options{SeqLen: 8, Classes: 2}, []string{"no config.json", "model.safetensors"}, checkpoint.ErrNoConfig},
		{"unknown architecture", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}`), 0o644)
		}, Options{SeqLen: 8, Classes: 2}, []string{`"llama"`, "not a supported model"}, checkpoint.ErrConfig},
		{"truncated weights", func(t *testing.T, dir string) {
			p := filepath.Join(dir, WeightsFile)
			b := mustRead(t, p)
			os.WriteFile(p, b[:len(b)-100], 0o644)
		}, Options{SeqLen: 8, Classes: 2}, []string{"model.safetensors"}, checkpoint.ErrFormat},
		{"wrong shape", func(t *testing.T, dir string) {
			// A head of 5 labels where the run has 3.
			writeTensors(t, dir, map[string][]int{"classifier.weight": {5, 8}})
		}, Options{SeqLen: 8, Classes: 3}, []string{"classifier.weight is [5 8], want [3 8]"}, checkpoint.ErrMismatch},
		{"too long", nil, Options{SeqLen: 17, Classes: 2}, []string{"17 tokens", "1 to 16"}, nil},
		{"no [SEP]", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte("[PAD]\n[UNK]\n"), 0o644)
		}, Options{SeqLen: 8, Classes: 2}, []string{"no [SEP]"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := fixture(t, "tiny-bert")
			if c.edit != nil {
				c.edit(t, dir)
			}
			ck, err := Open(dir, c.opt)
			if err == nil {
				ck.Close()
				t.Fatal("opened")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error of several lines: %q", msg)
			}
			for _, w := range c.wants {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %q is not %v", msg, c.is)
			}
		})
	}
}

// writeTensors adds tensors of the given shapes (zeros) to dir's
// model.safetensors, rewriting it with the package's own writer.
func writeTensors(t *testing.T, dir string, add map[string][]int) {
	t.Helper()
	p := filepath.Join(dir, WeightsFile)
	f, err := checkpoint.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	var tensors []Tensor
	for _, ti := range f.Tensors() {
		if !ti.DType.Float() {
			continue
		}
		d := make([]float32, ti.Len())
		if err := f.ReadFloat32(ti.Name, d); err != nil {
			t.Fatal(err)
		}
		tensors = append(tensors, Tensor{Name: ti.Name, Shape: ti.Shape, Data: d})
	}
	f.Close()
	for name, shape := range add {
		n := 1
		for _, s := range shape {
			n *= s
		}
		tensors = append(tensors, Tensor{Name: name, Shape: shape, Data: make([]float32, n)})
	}
	out, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := WriteSafetensors(out, tensors, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSpecForShapes checks the engine spec of each family: it builds,
// and its parameter count is the checkpoint model's.
func TestSpecForShapes(t *testing.T) {
	for _, name := range []string{"tiny-bert", "tiny-gpt2"} {
		cfg, err := checkpoint.ReadConfig(filepath.Join("..", "checkpoint", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		spec, err := SpecFor(cfg, Options{SeqLen: 16, Classes: 4, SepID: 3})
		if err != nil {
			t.Fatal(err)
		}
		m, err := model.New(spec)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cfg.NumLabels = 4
		want := 0
		for _, e := range cfg.Expected(checkpoint.HeadClassifier) {
			if !e.Buffer && e.TiedTo == "" {
				want += e.Len()
			}
		}
		if m.NumParams() != want {
			t.Errorf("%s: the engine's model has %d parameters, the checkpoint's %d", name, m.NumParams(), want)
		}
	}
}

package checkpoint_test

import (
	"bytes"
	"hash/crc32"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/checkpoint"
)

// The fixtures in testdata were written by testdata/make_fixtures.py, a
// Python program using only the standard library, laid out as
// save_pretrained writes them; TestFixturesAreFresh checks they are its
// current output.

// fixtureValue is element j of the fixture tensor name: the formula
// make_fixtures.py writes.
func fixtureValue(name string, j int) float32 {
	return float32(int64((uint64(crc32.ChecksumIEEE([]byte(name)))+17*uint64(j))%41)-20) / 16
}

// openFixture reads a fixture folder's config and opens its checkpoint.
func openFixture(t *testing.T, dir string) (checkpoint.Config, *checkpoint.File) {
	t.Helper()
	dir = filepath.Join("testdata", dir)
	cfg, err := checkpoint.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := checkpoint.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return cfg, f
}

// readPresent reads every present parameter, in the Expected order, into
// one θ and checks each value against the fixture's formula.
func readPresent(t *testing.T, f *checkpoint.File, want []checkpoint.Expected, r checkpoint.Report) {
	t.Helper()
	size := map[string]int{}
	for _, e := range want {
		n := 1
		for _, d := range e.Shape {
			n *= d
		}
		size[e.Name] = n
	}
	total := 0
	for _, s := range r.Present {
		total += size[s.Name]
	}
	theta := make([]float32, total)
	off := 0
	for _, s := range r.Present {
		view := theta[off : off+size[s.Name]]
		if err := f.ReadFloat32(s.File, view); err != nil {
			t.Fatal(err)
		}
		for j, v := range view {
			if w := fixtureValue(s.File, j); v != w {
				t.Fatalf("%s[%d] = %v, Python wrote %v", s.File, j, v, w)
			}
		}
		off += len(view)
	}
}

// TestFixtureBERT checks a BertForPreTraining checkpoint against BERT's
// Expected lists: as the base of a classifier (fresh head, the
// pretraining heads unexpected) and as a masked language model.
func TestFixtureBERT(t *testing.T) {
	cfg, f := openFixture(t, "tiny-bert")
	if cfg.Family != checkpoint.BERT || cfg.Hidden != 8 || cfg.Layers != 2 || cfg.MaxPositions != 16 || cfg.Vocab != 24 {
		t.Fatalf("config %+v", cfg)
	}
	want := cfg.Expected(checkpoint.HeadClassifier)
	r, err := checkpoint.Check(f, want)
	if err != nil {
		t.Fatal(err)
	}
	var base []string
	for _, e := range want {
		if !e.Buffer && !e.Optional || strings.HasPrefix(e.Name, "bert.pooler.") {
			base = append(base, e.Name)
		}
	}
	if got := sourceNames(r); !slices.Equal(got, base) {
		t.Errorf("present %v\nwant %v", got, base)
	}
	if !slices.Equal(r.Fresh, []string{"classifier.weight", "classifier.bias"}) ||
		!slices.Equal(r.Buffers, []string{"bert.embeddings.position_ids"}) ||
		!slices.Equal(r.Unexpected, []string{"cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias",
			"cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.dense.bias",
			"cls.predictions.transform.dense.weight", "cls.seq_relationship.bias", "cls.seq_relationship.weight"}) {
		t.Errorf("fresh %v, buffers %v, unexpected %v", r.Fresh, r.Buffers, r.Unexpected)
	}
	readPresent(t, f, want, r)

	mlm := cfg.Expected(checkpoint.HeadLM)
	r, err = checkpoint.Check(f, mlm)
	if err != nil {
		t.Fatal(err)
	}
	if r.Fresh != nil || !slices.Equal(r.Tied, []string{"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}) ||
		!slices.Equal(r.Unexpected, []string{"bert.pooler.dense.bias", "bert.pooler.dense.weight", "cls.seq_relationship.bias", "cls.seq_relationship.weight"}) {
		t.Errorf("as an MLM: fresh %v, tied %v, unexpected %v", r.Fresh, r.Tied, r.Unexpected)
	}
	readPresent(t, f, mlm, r)
}

// TestFixtureRoBERTa checks a float16 RobertaForSequenceClassification
// checkpoint: every expected tensor present, nothing else in the file.
func TestFixtureRoBERTa(t *testing.T) {
	cfg, f := openFixture(t, "tiny-roberta")
	if cfg.Family != checkpoint.RoBERTa || cfg.PositionOffset != 2 || cfg.MaxSequence() != 16 || cfg.TypeVocab != 1 ||
		cfg.NumLabels != 3 || !slices.Equal(cfg.Labels, []string{"negative", "neutral", "positive"}) {
		t.Fatalf("config %+v", cfg)
	}
	want := cfg.Expected(checkpoint.HeadClassifier)
	r, err := checkpoint.Check(f, want)
	if err != nil {
		t.Fatal(err)
	}
	if got := sourceNames(r); !slices.Equal(got, params(want)) || r.Fresh != nil || r.Unexpected != nil || r.Buffers != nil {
		t.Errorf("report %+v", r)
	}
	for _, s := range r.Present {
		if s.DType != checkpoint.F16 {
			t.Fatalf("%s is %s, the fixture is float16", s.Name, s.DType)
		}
	}
	readPresent(t, f, want, r)
}

// TestFixtureGPT2 checks a bfloat16 checkpoint in openai-community/gpt2's
// form: bare GPT2Model names, causal-mask buffers, no lm_head.
func TestFixtureGPT2(t *testing.T) {
	cfg, f := openFixture(t, "tiny-gpt2")
	if cfg.Family != checkpoint.GPT2 || cfg.Intermediate != 32 || cfg.PadTokenID != -1 {
		t.Fatalf("config %+v", cfg)
	}
	for _, head := range []checkpoint.HeadKind{checkpoint.HeadLM, checkpoint.HeadClassifier} {
		want := cfg.Expected(head)
		r, err := checkpoint.Check(f, want)
		if err != nil {
			t.Fatal(err)
		}
		if got := sourceNames(r); r.Stripped != "transformer." || !slices.Equal(got, params(want)[:len(got)]) || len(r.Buffers) != 4 || r.Unexpected != nil {
			t.Errorf("%v: report %+v", head, r)
		}
		for _, s := range r.Present {
			if s.File != strings.TrimPrefix(s.Name, "transformer.") || s.DType != checkpoint.BF16 {
				t.Fatalf("%v: %+v", head, s)
			}
		}
		switch head {
		case checkpoint.HeadLM:
			if !slices.Equal(r.Tied, []string{"lm_head.weight"}) || r.Fresh != nil {
				t.Errorf("tied %v, fresh %v", r.Tied, r.Fresh)
			}
		case checkpoint.HeadClassifier:
			if !slices.Equal(r.Fresh, []string{"score.weight"}) {
				t.Errorf("fresh %v", r.Fresh)
			}
		}
		readPresent(t, f, want, r)
	}
	mask, ok := f.Tensor("h.1.attn.bias")
	if !ok || !slices.Equal(mask.Shape, []int{1, 1, 16, 16}) {
		t.Errorf("causal mask %+v", mask)
	}
}

// TestFixtureConversions compares ReadFloat32's F16 and F64 conversions
// with Python's struct module ('<e' decoding, '<f' rounding).
func TestFixtureConversions(t *testing.T) {
	f, err := checkpoint.Open(filepath.Join("testdata", "conversions.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, name := range []string{"f16", "f64"} {
		ti, _ := f.Tensor(name)
		got, want := make([]float32, ti.Len()), make([]float32, ti.Len())
		if err := f.ReadFloat32(name, got); err != nil {
			t.Fatal(err)
		}
		if err := f.ReadFloat32(name+".expected", want); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			g, w := got[i], want[i]
			if g != g && w != w { // NaN: Python keeps no payload
				continue
			}
			if math.Float32bits(g) != math.Float32bits(w) {
				t.Errorf("%s[%d] = %#08x, Python says %#08x", name, i, math.Float32bits(g), math.Float32bits(w))
			}
		}
	}
}

// TestFixturesAreFresh runs make_fixtures.py into a temporary folder and
// compares its output with the committed files byte for byte. It needs
// python3 (Debian's, or $DPCLUSTER_PYTHON); it skips without one, except
// in CI.
func TestFixturesAreFresh(t *testing.T) {
	py := ""
	for _, p := range []string{os.Getenv("DPCLUSTER_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			py = path
			break
		}
	}
	if py == "" {
		if os.Getenv("DPCLUSTER_CI") != "" {
			t.Fatal("DPCLUSTER_CI is set but python3 is missing")
		}
		t.Skip("needs python3")
	}
	out := t.TempDir()
	cmd := exec.Command(py, filepath.Join("testdata", "make_fixtures.py"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	n := 0
	err := filepath.WalkDir(out, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, path)
		fresh, _ := os.ReadFile(path)
		committed, err := os.ReadFile(filepath.Join("testdata", rel))
		if err != nil || !bytes.Equal(fresh, committed) {
			t.Errorf("testdata/%s differs from make_fixtures.py's output (%v): run python3 testdata/make_fixtures.py", rel, err)
		}
		n++
		return nil
	})
	if err != nil || n != 7 {
		t.Fatalf("walked %d files: %v", n, err)
	}
}

func sourceNames(r checkpoint.Report) (names []string) {
	for _, s := range r.Present {
		names = append(names, s.Name)
	}
	return names
}

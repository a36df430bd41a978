package checkpoint_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/checkpoint"
)

// tiny returns a small valid configuration of the family.
func tiny(t *testing.T, fam checkpoint.Family, extra string) checkpoint.Config {
	t.Helper()
	text := `{"model_type": "` + string(fam) + `", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2,
  "intermediate_size": 16, "vocab_size": 20, "max_position_embeddings": 12, "type_vocab_size": 2, "num_labels": 3` + extra + `}`
	if fam == checkpoint.GPT2 {
		text = `{"model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 2, "vocab_size": 20, "n_positions": 12, "num_labels": 3` + extra + `}`
	}
	c, err := checkpoint.ReadConfig(configDir(t, text))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fileOf builds a checkpoint holding want's tensors as F32 zeros (a
// buffer as one I64), less those drop rejects, each named by rename.
func fileOf(t *testing.T, want []checkpoint.Expected, drop func(checkpoint.Expected) bool, rename func(string) string) *checkpoint.File {
	t.Helper()
	var ts []st
	for _, e := range want {
		if drop != nil && drop(e) {
			continue
		}
		name := e.Name
		if rename != nil {
			name = rename(name)
		}
		if e.Buffer {
			ts = append(ts, st{name, "I64", []int{1}, make([]byte, 8)})
			continue
		}
		n := 1
		for _, d := range e.Shape {
			n *= d
		}
		ts = append(ts, st{name, "F32", e.Shape, make([]byte, 4*n)})
	}
	f, err := newFile(build(t, map[string]string{"format": "pt"}, ts...))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func params(want []checkpoint.Expected) (names []string) {
	for _, e := range want {
		if !e.Buffer && e.TiedTo == "" {
			names = append(names, e.Name)
		}
	}
	return names
}

// TestCheckComplete checks a file holding every expected tensor: all
// present, read from their own names, nothing else reported.
func TestCheckComplete(t *testing.T) {
	for _, fam := range []checkpoint.Family{checkpoint.BERT, checkpoint.RoBERTa, checkpoint.GPT2} {
		for _, head := range []checkpoint.HeadKind{checkpoint.HeadNone, checkpoint.HeadClassifier, checkpoint.HeadLM} {
			want := tiny(t, fam, "").Expected(head)
			r, err := checkpoint.Check(fileOf(t, want, nil, nil), want)
			if err != nil {
				t.Fatalf("%s/%v: %v", fam, head, err)
			}
			var got []string
			for _, s := range r.Present {
				if s.File != s.Name || s.DType != checkpoint.F32 {
					t.Errorf("%s/%v: %+v", fam, head, s)
				}
				got = append(got, s.Name)
			}
			if !slices.Equal(got, params(want)) || r.Missing != nil || r.Fresh != nil || r.Unexpected != nil || r.Stripped != "" {
				t.Errorf("%s/%v: report %+v", fam, head, r)
			}
		}
	}
}

// TestCheckFindings checks each kind of finding and the one-line error.
func TestCheckFindings(t *testing.T) {
	bert := tiny(t, checkpoint.BERT, "")
	want := bert.Expected(checkpoint.HeadClassifier)
	isHead := func(e checkpoint.Expected) bool { return strings.HasPrefix(e.Name, "classifier.") }

	// A pretrained encoder without a classifier: the head is fresh.
	r, err := checkpoint.Check(fileOf(t, want, isHead, nil), want)
	if err != nil || !slices.Equal(r.Fresh, []string{"classifier.weight", "classifier.bias"}) {
		t.Errorf("fresh head: %v, %+v", err, r.Fresh)
	}
	if !slices.Equal(r.Buffers, []string{"bert.embeddings.position_ids", "bert.embeddings.token_type_ids"}) {
		t.Errorf("buffers %v", r.Buffers)
	}

	// Another head's tensors are unexpected, not an error.
	mlm := bert.Expected(checkpoint.HeadLM)
	r, err = checkpoint.Check(fileOf(t, mlm, nil, nil), want)
	if err != nil || !slices.Equal(r.Unexpected, []string{"cls.predictions.bias", "cls.predictions.decoder.bias", "cls.predictions.decoder.weight",
		"cls.predictions.transform.LayerNorm.bias", "cls.predictions.transform.LayerNorm.weight",
		"cls.predictions.transform.dense.bias", "cls.predictions.transform.dense.weight"}) {
		t.Errorf("MLM checkpoint for a classifier: %v, unexpected %v", err, r.Unexpected)
	}
	if !slices.Equal(r.Fresh, []string{"bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"}) {
		t.Errorf("MLM checkpoint for a classifier: fresh %v", r.Fresh)
	}

	// Five missing layers' worth of tensors: named, counted, cut short.
	r, err = checkpoint.Check(fileOf(t, want, func(e checkpoint.Expected) bool { return strings.Contains(e.Name, "layer.1.") }, nil), want)
	if !errors.Is(err, checkpoint.ErrMismatch) || len(r.Missing) != 16 ||
		!strings.Contains(err.Error(), "16 required tensors missing (bert.encoder.layer.1.attention.self.query.weight, bert.encoder.layer.1.attention.self.query.bias, bert.encoder.layer.1.attention.self.key.weight, bert.encoder.layer.1.attention.self.key.bias and 12 more)") {
		t.Errorf("missing layer: %v", err)
	}

	// A tensor of the wrong shape: both shapes, one line.
	wrong := slices.Clone(want)
	for i, e := range wrong {
		if e.Name == "classifier.weight" {
			wrong[i].Shape = []int{2, 8}
		}
	}
	r, err = checkpoint.Check(fileOf(t, wrong, nil, nil), want)
	if !errors.Is(err, checkpoint.ErrMismatch) || len(r.Mismatched) != 1 ||
		!strings.Contains(err.Error(), "1 of the wrong shape (classifier.weight is [2 8], want [3 8])") || strings.Contains(err.Error(), "\n") {
		t.Errorf("wrong shape: %v", err)
	}
}

// TestCheckWrongType checks a parameter of the right shape stored in a
// type ReadFloat32 does not convert.
func TestCheckWrongType(t *testing.T) {
	want := []checkpoint.Expected{{Name: "w", Shape: []int{2}}, {Name: "b", Shape: []int{2}}}
	f, err := newFile(build(t, nil, st{"w", "I32", []int{2}, make([]byte, 8)}, st{"b", "F16", []int{2}, make([]byte, 4)}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := checkpoint.Check(f, want)
	if !errors.Is(err, checkpoint.ErrMismatch) || !strings.Contains(err.Error(), "1 of a type other than F32, F16, BF16, F64 (w is I32)") ||
		len(r.Present) != 1 || r.Present[0].DType != checkpoint.F16 {
		t.Errorf("%v, %+v", err, r)
	}
}

// TestCheckStrippedPrefix checks a bare GPT2Model checkpoint, as
// openai-community/gpt2 is saved: no "transformer." prefix, the causal
// mask buffers, no lm_head (tied to wte).
func TestCheckStrippedPrefix(t *testing.T) {
	want := tiny(t, checkpoint.GPT2, "").Expected(checkpoint.HeadLM)
	noHead := func(e checkpoint.Expected) bool { return e.Name == "lm_head.weight" }
	strip := func(n string) string { return strings.TrimPrefix(n, "transformer.") }
	r, err := checkpoint.Check(fileOf(t, want, noHead, strip), want)
	if err != nil {
		t.Fatal(err)
	}
	if r.Stripped != "transformer." || r.Present[0].Name != "transformer.wte.weight" || r.Present[0].File != "wte.weight" {
		t.Errorf("stripped %q, first %+v", r.Stripped, r.Present[0])
	}
	if !slices.Equal(r.Tied, []string{"lm_head.weight"}) || r.Fresh != nil || r.Unexpected != nil {
		t.Errorf("tied %v, fresh %v, unexpected %v", r.Tied, r.Fresh, r.Unexpected)
	}
	if !slices.Equal(r.Buffers, []string{"h.0.attn.bias", "h.0.attn.masked_bias", "h.1.attn.bias", "h.1.attn.masked_bias"}) {
		t.Errorf("buffers %v", r.Buffers)
	}
	// A file mixing both conventions keeps the prefix: the bare names are
	// then unexpected and the prefixed ones missing.
	mixed := fileOf(t, want, nil, func(n string) string {
		if strings.Contains(n, "h.1.") {
			return strip(n)
		}
		return n
	})
	r, err = checkpoint.Check(mixed, want)
	if !errors.Is(err, checkpoint.ErrMismatch) || r.Stripped != "" || len(r.Missing) != 12 || len(r.Unexpected) != 14 {
		t.Errorf("mixed names: %v, missing %d, unexpected %d", err, len(r.Missing), len(r.Unexpected))
	}
}

// TestCheckTied checks tied weights: an untied configuration makes the LM
// head a parameter; a tied one found only under the head's name supplies
// the embedding.
func TestCheckTied(t *testing.T) {
	untied := tiny(t, checkpoint.GPT2, `, "tie_word_embeddings": false`).Expected(checkpoint.HeadLM)
	r, err := checkpoint.Check(fileOf(t, untied, nil, nil), untied)
	if err != nil || r.Tied != nil || r.Present[len(r.Present)-1].Name != "lm_head.weight" {
		t.Errorf("untied: %v, %+v", err, r)
	}
	tied := tiny(t, checkpoint.GPT2, "").Expected(checkpoint.HeadLM)
	r, err = checkpoint.Check(fileOf(t, tied, func(e checkpoint.Expected) bool { return e.Name == "transformer.wte.weight" }, nil), tied)
	if err != nil || r.Present[0] != (checkpoint.Source{Name: "transformer.wte.weight", File: "lm_head.weight", DType: checkpoint.F32}) {
		t.Errorf("embedding from the head: %v, %+v", err, r.Present[0])
	}
}

// TestExpectedShapes spot-checks the layouts that differ between the
// families: GPT-2's transposed Conv1D weights, RoBERTa's head without a
// pooler, the MLP width.
func TestExpectedShapes(t *testing.T) {
	find := func(want []checkpoint.Expected, name string) checkpoint.Expected {
		for _, e := range want {
			if e.Name == name {
				return e
			}
		}
		t.Fatalf("no %s", name)
		return checkpoint.Expected{}
	}
	g := tiny(t, checkpoint.GPT2, "").Expected(checkpoint.HeadClassifier)
	for name, shape := range map[string][]int{
		"transformer.h.0.attn.c_attn.weight": {8, 24},
		"transformer.h.0.mlp.c_fc.weight":    {8, 32},
		"transformer.h.1.mlp.c_proj.weight":  {32, 8},
		"score.weight":                       {3, 8},
	} {
		e := find(g, name)
		if !slices.Equal(e.Shape, shape) || e.Transposed != strings.HasPrefix(name, "transformer.h.") {
			t.Errorf("%s: %+v, want shape %v", name, e, shape)
		}
	}
	r := tiny(t, checkpoint.RoBERTa, "").Expected(checkpoint.HeadClassifier)
	if e := find(r, "classifier.out_proj.weight"); !slices.Equal(e.Shape, []int{3, 8}) || !e.Optional {
		t.Errorf("out_proj %+v", e)
	}
	for _, e := range r {
		if strings.Contains(e.Name, "pooler") {
			t.Errorf("RoBERTa's classifier has no pooler, Expected lists %s", e.Name)
		}
	}
	if e := find(tiny(t, checkpoint.BERT, "").Expected(checkpoint.HeadNone), "bert.encoder.layer.1.intermediate.dense.weight"); !slices.Equal(e.Shape, []int{16, 8}) {
		t.Errorf("intermediate %+v", e)
	}
}

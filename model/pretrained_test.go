package model

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
)

// Small models shaped as the pretrained checkpoints that will be imported:
// BERT and RoBERTa encoders (post-layer-norm blocks, padding mask, GELU,
// the pooler on the first token) and GPT-2 decoders (pre-layer-norm
// blocks, causal attention, the tanh GELU, the classifier on the last
// token without a bias, or the language model). The specs are built the
// way an importer builds them from config.json; the tests check
// gradients, clipped sums, the bound's tightness and determinism on
// batches with padding.

// pretrainedShape is the size of a small pretrained-style model.
type pretrainedShape struct {
	vocab, seqLen, width, heads, blocks, classes int
	// positions and posOffset size the position table; types and sep the
	// token-type table (sep is used with types ≥ 2).
	positions, posOffset, types, sep int
	eps                              float64 // layer norms' epsilon (0: the default)
}

// bertLike is a BERT (RoBERTa with posOffset 2 and one type) sequence
// classifier: embedding → layernorm → blocks × [residual(linear 3·width →
// attention with the padding mask → linear width) → layernorm →
// residual(linear 4·width → gelu → linear width) → layernorm] → first
// token → linear width → tanh (the pooler) → linear classes.
func bertLike(s pretrainedShape) Spec {
	emb := LayerSpec{Type: Embedding, Vocab: s.vocab, Dim: s.width, Positions: s.positions, PosOffset: s.posOffset, Types: s.types}
	if s.types >= 2 {
		emb.TypeSep = intPtr(s.sep)
	}
	ln := LayerSpec{Type: LayerNorm, Eps: s.eps}
	layers := []LayerSpec{emb, ln}
	for range s.blocks {
		layers = append(layers,
			LayerSpec{Type: Residual, Layers: []LayerSpec{
				{Type: Linear, Out: 3 * s.width}, {Type: Attention, Heads: s.heads, Mask: MaskPadding}, {Type: Linear, Out: s.width}}},
			ln,
			LayerSpec{Type: Residual, Layers: []LayerSpec{
				{Type: Linear, Out: 4 * s.width}, {Type: GELU}, {Type: Linear, Out: s.width}}},
			ln)
	}
	layers = append(layers, LayerSpec{Type: FirstToken}, LayerSpec{Type: Linear, Out: s.width}, LayerSpec{Type: Tanh},
		LayerSpec{Type: Linear, Out: s.classes})
	return Spec{Name: "bert-like", Input: []int{s.seqLen}, Classes: s.classes, Layers: layers}
}

// gpt2Like is a GPT-2 model: embedding → blocks × [residual(layernorm →
// linear 3·width → causal attention → linear width), residual(layernorm →
// linear 4·width → gelu_tanh → linear width)] → layernorm, then either
// the sequence classifier (last non-padding token → linear classes
// without a bias) or, with lm, a linear vocab at every position under
// the next-token loss.
func gpt2Like(s pretrainedShape, lm bool) Spec {
	ln := LayerSpec{Type: LayerNorm, Eps: s.eps}
	layers := []LayerSpec{{Type: Embedding, Vocab: s.vocab, Dim: s.width, Positions: s.positions}}
	for range s.blocks {
		layers = append(layers,
			LayerSpec{Type: Residual, Layers: []LayerSpec{
				ln, {Type: Linear, Out: 3 * s.width}, {Type: Attention, Heads: s.heads, Mask: MaskCausal}, {Type: Linear, Out: s.width}}},
			LayerSpec{Type: Residual, Layers: []LayerSpec{
				ln, {Type: Linear, Out: 4 * s.width}, {Type: GELUTanh}, {Type: Linear, Out: s.width}}})
	}
	layers = append(layers, ln)
	if lm {
		layers = append(layers, LayerSpec{Type: Linear, Out: s.vocab})
		return Spec{Name: "gpt2-lm-like", Input: []int{s.seqLen + 1}, Classes: s.vocab, Loss: NextToken, Layers: layers}
	}
	layers = append(layers, LayerSpec{Type: LastToken}, LayerSpec{Type: Linear, Out: s.classes, NoBias: true})
	return Spec{Name: "gpt2-like", Input: []int{s.seqLen}, Classes: s.classes, Layers: layers}
}

// tinyBERT is the brief's BERT shape: vocabulary 50, 8 tokens, width 16,
// 2 heads, 2 blocks, 2 token types ([SEP] = 3), 12 positions, layer norms
// at 1e-12 (BERT's layer_norm_eps), 3 classes.
func tinyBERT() pretrainedShape {
	return pretrainedShape{vocab: 50, seqLen: 8, width: 16, heads: 2, blocks: 2, classes: 3,
		positions: 12, types: 2, sep: 3, eps: 1e-12}
}

// tinyGPT2 is GPT-2's stack at the same size: 12 positions, default
// layer norms, 2 classes.
func tinyGPT2() pretrainedShape {
	return pretrainedShape{vocab: 50, seqLen: 8, width: 16, heads: 2, blocks: 2, classes: 2, positions: 12}
}

// tinyRoBERTa is tinyBERT as RoBERTa: positions from row 2 of T+2, one
// token type.
func tinyRoBERTa() pretrainedShape {
	s := tinyBERT()
	s.positions, s.posOffset, s.types = s.seqLen+2, 2, 1
	return s
}

// segmentBatch draws B examples of seqLen token ids the way a tokenizer
// pads them: "[CLS] a [SEP] b [SEP]" (cls = 1, sep) of random lengths,
// or one segment, then padding (-1); example 0 fills every position,
// example 1 is all padding, example 2 is one token. Labels are uniform.
func segmentBatch(s pretrainedShape, B int, rng *rand.Rand) ([]float32, []int32) {
	T := s.seqLen
	x := make([]float32, B*T)
	y := make([]int32, B)
	word := func() float32 { return float32(4 + rng.IntN(s.vocab-4)) }
	for i := range B {
		ex := x[i*T : (i+1)*T]
		for t := range ex {
			ex[t] = -1
		}
		n := T
		switch i {
		case 0:
		case 1:
			n = 0
		case 2:
			n = 1
		default:
			n = 1 + rng.IntN(T)
		}
		for t := 0; t < n; t++ {
			ex[t] = word()
		}
		if n > 0 {
			ex[0] = 1 // [CLS]
			ex[n-1] = float32(s.sep)
			if n > 3 && rng.IntN(2) == 0 {
				ex[1+rng.IntN(n-2)] = float32(s.sep) // a second segment
			}
		}
		y[i] = int32(rng.IntN(s.classes))
	}
	return x, y
}

// lmBatch is segmentBatch's ids for a next-token model: seqLen+1 ids per
// example, padding at the end.
func lmBatch(s pretrainedShape, B int, rng *rand.Rand) ([]float32, []int32) {
	t := s
	t.seqLen++
	x, _ := segmentBatch(t, B, rng)
	return x, make([]int32, B)
}

// pretrainedCase is one of the pretrained-shaped models with a batch.
type pretrainedCase struct {
	name  string
	spec  Spec
	batch func(B int, rng *rand.Rand) ([]float32, []int32)
}

func pretrainedCases() []pretrainedCase {
	seg := func(s pretrainedShape) func(int, *rand.Rand) ([]float32, []int32) {
		return func(B int, rng *rand.Rand) ([]float32, []int32) { return segmentBatch(s, B, rng) }
	}
	lm := tinyGPT2()
	lm.vocab = 20
	return []pretrainedCase{
		{"bert", bertLike(tinyBERT()), seg(tinyBERT())},
		{"roberta", bertLike(tinyRoBERTa()), seg(tinyRoBERTa())},
		{"gpt2", gpt2Like(tinyGPT2(), false), seg(tinyGPT2())},
		{"gpt2-lm", gpt2Like(lm, true), func(B int, rng *rand.Rand) ([]float32, []int32) { return lmBatch(lm, B, rng) }},
	}
}

// TestPretrainedShapes: the specs build, with BERT's and GPT-2's parameter
// counts for their shapes, and the CUDA engine refuses them.
func TestPretrainedShapes(t *testing.T) {
	b, g := tinyBERT(), tinyGPT2()
	W := b.width
	block := (W*3*W + 3*W) + (W*W + W) + (W*4*W + 4*W) + (4*W*W + W) + 2*2*W // attention, MLP, two layer norms
	for _, c := range []struct {
		spec Spec
		want int
	}{
		{bertLike(b), b.vocab*W + b.positions*W + b.types*W + 2*W + b.blocks*block + (W*W + W) + (W*b.classes + b.classes)},
		{gpt2Like(g, false), g.vocab*W + g.positions*W + g.blocks*block + 2*W + W*g.classes},
	} {
		m, err := New(c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.spec.Name, err)
		}
		if m.NumParams() != c.want {
			t.Errorf("%s: %d parameters, want %d", c.spec.Name, m.NumParams(), c.want)
		}
		if err := cudaSupports(m); err == nil {
			t.Errorf("%s: the CUDA engine's plan accepts it", c.spec.Name)
		}
	}
}

// TestPretrainedGradients checks MeanGrad against central differences of
// the float64 reference on the pretrained-shaped models, on batches with
// padding (a full example, an all-padding one, a one-token one).
func TestPretrainedGradients(t *testing.T) {
	for ci, c := range pretrainedCases() {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(ci), 21))
			x, y := c.batch(4, rng)
			checkFiniteDifferences(t, m, randomTheta(t, m, uint64(ci)), x, y, rng)
		})
	}
}

// TestPretrainedClippedSum: on the pretrained-shaped models, with both
// norm strategies of the linear layers, ClippedSum matches the naive
// reference, clips every example against the exact per-example
// gradients (at the median norm and at a clip below every norm), the
// clip norm is never below the true norm and, with the layers' own norm
// strategies, less than 1e-4 above it (checkClipTight), the chunked sum
// matches one ClippedSum, and the sum is the same bits whatever
// GOMAXPROCS is.
func TestPretrainedClippedSum(t *testing.T) {
	for ci, c := range pretrainedCases() {
		m0, err := New(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, ghost := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/ghost=%v", c.name, ghost), func(t *testing.T) {
				m := withConvMode(m0, ghost)
				const B = 7
				rng := rand.New(rand.NewPCG(uint64(ci), 22))
				theta := randomTheta(t, m, uint64(ci)+40)
				x, y := c.batch(B, rng)
				checkClippedOn(t, m, theta, x, y, B)
				ws, _ := m.NewWorkspace(B)
				norms := perExampleNorms(t, ws, theta, x, y)
				sorted := slices.DeleteFunc(slices.Clone(norms), func(n float64) bool { return n == 0 })
				slices.Sort(sorted)
				for _, clip := range []float64{sorted[len(sorted)/2], sorted[0] / 4} {
					checkClipAgainstReference(t, m, theta, x, y, clip)
				}
				checkClipTight(t, m, theta, x, y, slices.Equal(ghostFlags(m), ghostFlags(m0)))
				// Chunks of 3 against one call.
				d := &dataset.Dataset{Name: c.name, X: x, Y: y, Dim: m.InputSize(), Classes: m.Classes(), Vocab: m.vocab}
				idx := []int{6, 1, 4, 1, 5, 0, 2, 3}
				small, _ := m.NewWorkspace(3)
				got, want := make([]float32, m.NumParams()), make([]float32, m.NumParams())
				if _, err := small.ClippedSumIndexed(got, theta, d, idx, 0.5); err != nil {
					t.Fatal(err)
				}
				sub := d.Subset(idx)
				big, _ := m.NewWorkspace(len(idx))
				if _, err := big.ClippedSum(want, theta, sub.X, sub.Y, 0.5); err != nil {
					t.Fatal(err)
				}
				if rel := relDiff(got, want); rel > 1e-5 {
					t.Errorf("chunked vs single: relative difference %.3g", rel)
				}
				// Determinism across GOMAXPROCS.
				run := func(procs int) []float32 {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
					w, _ := m.NewWorkspace(B)
					out := make([]float32, m.NumParams())
					if _, err := w.ClippedSum(out, theta, x, y, 0.5); err != nil {
						t.Fatal(err)
					}
					return out
				}
				if a, b := run(1), run(4); !slices.Equal(a, b) {
					t.Errorf("clipped sum differs between GOMAXPROCS 1 and 4")
				}
			})
		}
	}
}

// checkClipTight checks that every example's clip norm is at least its
// true norm and, if tight, less than 1e-4 above it (ClippedSum's doc
// comment: up to 6.1e-5 on the transformer preset, with the layers' own
// norm strategies; the ghost norm forced on every linear layer can exceed
// it, κ·(ρᵢ/‖Gᵢ‖)²/2 in conv.bound).
func checkClipTight(t *testing.T, m *Model, theta, x []float32, y []int32, tight bool) {
	t.Helper()
	B := len(y)
	ws, _ := m.NewWorkspace(B)
	ref := refGrads(ws, theta, x, y)
	if _, err := ws.ClippedSum(make([]float32, m.NumParams()), theta, x, y, 1e-3); err != nil {
		t.Fatal(err)
	}
	for i, n := range clipNorms(ws, B) {
		tn := norm64(ref[i])
		if r := n/tn - 1; tn > 0 && !(r >= 0 && (r < 1e-4 || !tight)) {
			t.Errorf("example %d: clip norm %v, true norm %v: relative over-estimate %.3g, want in [0, 1e-4)", i, n, tn, r)
		}
	}
}

// ghostFlags lists the norm strategy of each of m's linear layers at T
// positions, nested ones included, in order.
func ghostFlags(m *Model) []bool {
	var out []bool
	var walk func(ly layer)
	walk = func(ly layer) {
		switch ly := ly.(type) {
		case *seqLinear:
			out = append(out, ly.ghost)
		case *residual:
			for _, nl := range ly.layers {
				walk(nl)
			}
		}
	}
	for _, ly := range m.layers {
		walk(ly)
	}
	return out
}

// TestPretrainedClipAdversarial: the pretrained-shaped models with token
// embeddings near 10⁴ and then 10¹⁹ (large, nearly equal activations at
// every position, through layer norms at 1e-12), alternating labels and
// repeated tokens: the clip holds against the reference for every layer.
func TestPretrainedClipAdversarial(t *testing.T) {
	for ci, c := range pretrainedCases() {
		m0, err := New(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		for k, scale := range []float32{1e4, 1e19} {
			theta := randomTheta(t, m0, uint64(ci))
			tok, _ := m0.Param(theta, "0.weight")
			for j := range tok {
				tok[j] = scale * (1 + float32(j%3)*1e-6)
			}
			rng := rand.New(rand.NewPCG(uint64(k), uint64(ci)))
			x, y := c.batch(5, rng)
			d := m0.InputSize()
			for j := range d {
				x[3*d+j] = float32(4 + j%2) // two tokens alternating
			}
			for i := range y {
				y[i] = int32(i % m0.Classes())
			}
			for _, ghost := range []bool{true, false} {
				for _, clip := range []float64{0.1, 10} {
					checkClipAgainstReference(t, withConvMode(m0, ghost), theta, x, y, clip)
				}
			}
		}
	}
}

// randomPretrainedSpec draws a small model with the layers of pretrained
// encoders and decoders: a BERT- or RoBERTa-like encoder, a GPT-2-like
// classifier or language model (0 to 2 blocks, 1 or 2 heads, a position
// table up to 3 rows longer than needed), or a dense network of gelu or
// gelu_tanh with linear layers with or without bias.
func randomPretrainedSpec(rng *rand.Rand) Spec {
	heads := 1 + rng.IntN(2)
	s := pretrainedShape{vocab: 4 + rng.IntN(8), seqLen: 1 + rng.IntN(7), width: heads * (1 + rng.IntN(3)), heads: heads,
		blocks: rng.IntN(3), classes: 2 + rng.IntN(3)}
	s.positions = s.seqLen + rng.IntN(4)
	switch rng.IntN(5) {
	case 0:
		s.types, s.sep = 1+rng.IntN(3), rng.IntN(s.vocab)
		s.eps = []float64{0, 1e-12}[rng.IntN(2)]
		return bertLike(s)
	case 1:
		s.posOffset, s.types = 2, 1
		s.positions += 2
		return bertLike(s)
	case 2:
		return gpt2Like(s, false)
	case 3:
		return gpt2Like(s, true)
	}
	act := []string{GELU, GELUTanh}
	sp := Spec{Name: "rand-gelu", Input: []int{1 + rng.IntN(8)}, Classes: s.classes}
	for range 1 + rng.IntN(2) {
		sp.Layers = append(sp.Layers, LayerSpec{Type: Linear, Out: 1 + rng.IntN(8), NoBias: rng.IntN(2) == 0}, LayerSpec{Type: act[rng.IntN(2)]})
	}
	sp.Layers = append(sp.Layers, LayerSpec{Type: Linear, Out: s.classes, NoBias: rng.IntN(2) == 0})
	return sp
}

// randomAdaptedSpec is randomPretrainedSpec fine-tuned as the two ways
// of training a subset do: LoRA adapters of random rank (over every
// output, or one or two random ranges of them) on the linear layers
// nested in residual blocks, and a head trained by a Trainable pattern
// (which alone freezes the rest when no block takes adapters).
func randomAdaptedSpec(rng *rand.Rand) Spec {
	s := randomPretrainedSpec(rng)
	s.Name += "-adapted"
	for i := range s.Layers {
		l := &s.Layers[i]
		if l.Type != Residual {
			continue
		}
		l.Layers = slices.Clone(l.Layers)
		for j := range l.Layers {
			n := &l.Layers[j]
			if n.Type != Linear || n.NoBias || rng.IntN(3) == 0 {
				continue
			}
			in := s.Layers[0].Dim
			lr := &LoRA{Rank: 1 + rng.IntN(min(in, n.Out)), Alpha: float64(rng.IntN(17))}
			if rng.IntN(2) == 0 && n.Out > 1 {
				cut := 1 + rng.IntN(n.Out-1)
				lr.Parts = []LoRAPart{{"a", 0, cut}}
				if rng.IntN(2) == 0 {
					lr.Parts = append(lr.Parts, LoRAPart{"b", cut, n.Out})
				}
			}
			n.LoRA = lr
		}
	}
	if rng.IntN(2) == 0 || len(s.Layers) < 2 {
		s.Trainable = []string{fmt.Sprintf("%d.*", len(s.Layers)-1)}
	}
	return s
}

// newWithBase builds spec's model; one that freezes layers gets random
// frozen values (InitFull plus noise, so LoRA's B is not zero).
func newWithBase(t testing.TB, spec Spec, seed uint64) *Model {
	t.Helper()
	m, err := New(spec)
	if err != nil {
		t.Fatalf("%+v: %v", spec, err)
	}
	if !m.Freezes() {
		return m
	}
	base := make([]float32, m.NumFullParams())
	if err := m.InitFull(base, seed); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 77))
	for i := range base {
		base[i] += float32(0.3 * rng.NormFloat64())
	}
	fm, err := m.WithFrozen(base)
	if err != nil {
		t.Fatal(err)
	}
	return fm
}

// TestClipRandomAdapted is TestClipRandomPretrained on randomAdaptedSpec:
// LoRA adapters and frozen layers.
func TestClipRandomAdapted(t *testing.T) {
	checkClipRandom(t, rand.New(rand.NewPCG(2026, 45)), randomAdaptedSpec, 9)
}

// TestClipRandomPretrained checks the clip against the exact per-example
// reference on random pretrained-style models (randomPretrainedSpec), with
// the clip norm at the median per-example norm.
func TestClipRandomPretrained(t *testing.T) {
	checkClipRandom(t, rand.New(rand.NewPCG(2026, 5)), randomPretrainedSpec, 8)
}

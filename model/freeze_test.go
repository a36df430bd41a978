package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// frozenCase is a pretrained-shaped model with some layers frozen.
type frozenCase struct {
	name              string
	base              pretrainedCase
	trainable, freeze []string
}

// frozenCases freeze tinyBERT's and GPT-2's layers the ways fine-tuning
// does: the last block and the head (the paper's SST-2 setting), one
// nested layer of a block (its other nested layers frozen), the head
// only, and everything but the embeddings. The layers are unnamed, so
// names are indices: tinyBERT's layers 6–9 are its second block, 11 the
// pooler and 13 the classifier; tinyGPT2's 3 and 4 its second block,
// 5 the final layer norm, 7 the score.
func frozenCases() []frozenCase {
	cs := pretrainedCases()
	bert, gpt2, lm := cs[0], cs[2], cs[3]
	return []frozenCase{
		{"bert/last-block", bert, []string{"6.*", "7.*", "8.*", "9.*", "11.*", "13.*"}, nil},
		{"bert/nested", bert, []string{"6.2.*", "8.0.*", "13.*"}, nil},
		{"bert/head", bert, []string{"13.*"}, nil},
		{"bert/no-embeddings", bert, nil, []string{"0.*"}},
		{"gpt2/last-block", gpt2, []string{"4.*", "5.*", "7.*"}, nil},
		{"gpt2/ln-only", gpt2, []string{"*.0.weight", "*.0.bias", "5.*"}, nil},
		{"gpt2-lm/top", lm, []string{"5.*", "6.*"}, nil},
	}
}

// build returns the case's full model, its model with frozen layers over
// the full values base (random, as randomTheta draws them) and base.
func (c frozenCase) build(t *testing.T) (full, fm *Model, base []float32) {
	t.Helper()
	full, err := New(c.base.spec)
	if err != nil {
		t.Fatal(err)
	}
	base = randomTheta(t, full, 5)
	spec := c.base.spec
	spec.Trainable, spec.Freeze = c.trainable, c.freeze
	m, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Freezes() || m.NumParams() >= full.NumParams() || m.NumFullParams() != full.NumParams() {
		t.Fatalf("%s: freezes %v, %d of %d parameters train", c.name, m.Freezes(), m.NumParams(), m.NumFullParams())
	}
	fm, err = m.WithFrozen(base)
	if err != nil {
		t.Fatal(err)
	}
	return full, fm, base
}

// trainedTheta is theta for fm: the trainable values of base, moved a
// little so that they differ from base's (a pass that read base where it
// should read theta would be seen).
func trainedTheta(t *testing.T, fm *Model, seed uint64) []float32 {
	theta := make([]float32, fm.NumParams())
	if err := fm.Init(theta, 0); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range theta {
		theta[i] += float32(0.1 * rng.NormFloat64())
	}
	return theta
}

// TestFrozenGradientsAreTheFullModels: a model with frozen layers computes,
// for its trainable parameters, the same mean gradient and loss as the
// full model at the merged parameters, bit for bit (its backward pass
// stops at the lowest trainable layer, which must change nothing above
// it), and its clipped sum matches the naive per-example reference
// clipped over the trainable gradient only.
func TestFrozenGradientsAreTheFullModels(t *testing.T) {
	for ci, c := range frozenCases() {
		t.Run(c.name, func(t *testing.T) {
			full, fm, _ := c.build(t)
			theta := trainedTheta(t, fm, uint64(ci))
			merged := make([]float32, fm.NumFullParams())
			if err := fm.Merge(merged, theta); err != nil {
				t.Fatal(err)
			}
			const B = 6
			x, y := c.base.batch(B, rand.New(rand.NewPCG(uint64(ci), 2)))
			wf, _ := full.NewWorkspace(B)
			ws, err := fm.NewWorkspace(B)
			if err != nil {
				t.Fatal(err)
			}
			gFull := make([]float32, full.NumParams())
			lossFull, err := wf.MeanGrad(gFull, merged, x, y)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, fm.NumParams())
			if err := fm.Gather(want, gFull); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, fm.NumParams())
			loss, err := ws.MeanGrad(got, theta, x, y)
			if err != nil {
				t.Fatal(err)
			}
			if loss != lossFull || !slices.Equal(got, want) {
				t.Fatalf("mean gradient differs from the full model's trainable part (loss %v vs %v, relative %.3g)", loss, lossFull, relDiff(got, want))
			}
			checkClippedOn(t, fm, theta, x, y, B)
			checkClipTight(t, fm, theta, x, y, true)

			// The reference from the full model: each example's whole
			// gradient, its trainable part clipped in float64.
			ws1, _ := full.NewWorkspace(1)
			g := make([]float32, full.NumParams())
			part := make([]float32, fm.NumParams())
			ref := make([]float64, fm.NumParams())
			const clip = 0.05
			d := fm.InputSize()
			for i := range y {
				if _, err := ws1.MeanGrad(g, merged, x[i*d:(i+1)*d], y[i:i+1]); err != nil {
					t.Fatal(err)
				}
				_ = fm.Gather(part, g)
				s := 1.0
				if n := math.Sqrt(sumSq(part)); n > clip*clipShade {
					s = clip * clipShade / n
				}
				for j, v := range part {
					ref[j] += s * float64(v)
				}
			}
			sum := make([]float32, fm.NumParams())
			if _, err := ws.ClippedSum(sum, theta, x, y, clip); err != nil {
				t.Fatal(err)
			}
			ref32 := make([]float32, len(ref))
			for j, v := range ref {
				ref32[j] = float32(v)
			}
			if rel := relDiff(sum, ref32); rel > 2e-4 {
				t.Fatalf("clipped sum vs the full model's per-example trainable gradients: relative difference %.3g", rel)
			}
			if n := math.Sqrt(sumSq(sum)); n > B*clip {
				t.Fatalf("‖clipped sum‖ = %v > B·C = %v", n, B*clip)
			}
		})
	}
}

// TestFrozenClipAdversarial: with huge token embeddings in the frozen
// layers (their values are the base's, which an attacker who ships a
// checkpoint chooses) every example's clipped gradient stays within C.
func TestFrozenClipAdversarial(t *testing.T) {
	for _, c := range frozenCases()[:2] {
		t.Run(c.name, func(t *testing.T) {
			full, _, base := c.build(t)
			emb := full.FullParams()[0]
			for i := emb.Offset; i < emb.Offset+emb.Size; i++ {
				base[i] *= 1e4
			}
			spec := c.base.spec
			spec.Trainable, spec.Freeze = c.trainable, c.freeze
			m, _ := New(spec)
			fm, err := m.WithFrozen(base)
			if err != nil {
				t.Fatal(err)
			}
			theta := trainedTheta(t, fm, 9)
			x, y := c.base.batch(8, rand.New(rand.NewPCG(3, 4)))
			ws, _ := fm.NewWorkspace(1)
			sum := make([]float32, fm.NumParams())
			d := fm.InputSize()
			for i := range y {
				if _, err := ws.ClippedSum(sum, theta, x[i*d:(i+1)*d], y[i:i+1], 1e-3); err != nil {
					t.Fatal(err)
				}
				if n := math.Sqrt(sumSq(sum)); n > 1e-3 {
					t.Fatalf("example %d: ‖clipped gradient‖ = %v > C", i, n)
				}
			}
			checkClipAgainstReference(t, fm, theta, x, y, 1e-3)
		})
	}
}

// TestFrozenLayout: theta holds the trainable parameters in the full
// layout's order; Init, Gather and Merge move values between the two;
// Params lists only what trains.
func TestFrozenLayout(t *testing.T) {
	c := frozenCases()[0]
	full, fm, base := c.build(t)
	var names []string
	for _, p := range fm.Params() {
		names = append(names, p.Name)
		if !fm.Trainable(p.Name) {
			t.Errorf("%s listed but not trainable", p.Name)
		}
	}
	want := []string{"6.0.weight", "6.0.bias", "6.2.weight", "6.2.bias", "7.weight", "7.bias",
		"8.0.weight", "8.0.bias", "8.2.weight", "8.2.bias", "9.weight", "9.bias", "11.weight", "11.bias", "13.weight", "13.bias"}
	if !slices.Equal(names, want) {
		t.Fatalf("trainable parameters %v, want %v", names, want)
	}
	if fm.Trainable("0.weight") || len(fm.FullParams()) != len(full.Params()) {
		t.Fatal("the embedding trains, or FullParams is not every parameter")
	}
	theta := make([]float32, fm.NumParams())
	if err := fm.Init(theta, 123); err != nil {
		t.Fatal(err)
	}
	for _, p := range fm.Params() {
		got, _ := fm.Param(theta, p.Name)
		src, _ := full.Param(base, p.Name)
		if !slices.Equal(got, src) {
			t.Fatalf("Init: %s is not the base's", p.Name)
		}
	}
	merged := make([]float32, len(base))
	if err := fm.Merge(merged, theta); err != nil || !slices.Equal(merged, base) {
		t.Fatalf("Merge of Init's theta is not the base (%v)", err)
	}
	theta[0] = 42
	_ = fm.Merge(merged, theta)
	w6, _ := full.Param(merged, "6.0.weight")
	if w6[0] != 42 {
		t.Fatalf("Merge put theta[0] elsewhere than 6.0.weight[0]")
	}
}

// TestFrozenHash: the hash covers the spec's patterns and every frozen
// bit, and nothing else of the values.
func TestFrozenHash(t *testing.T) {
	c := frozenCases()[0]
	full, fm, base := c.build(t)
	if fm.Hash() == full.Hash() {
		t.Fatal("frozen model hashes as the full one")
	}
	spec := c.base.spec
	spec.Trainable = c.trainable
	m, _ := New(spec)
	if m.Hash() == full.Hash() || m.Hash() == fm.Hash() {
		t.Fatal("the patterns or the frozen values are not in the hash")
	}
	other := slices.Clone(base)
	again, _ := m.WithFrozen(other)
	if again.Hash() != fm.Hash() {
		t.Fatal("same frozen values, different hash")
	}
	// A trainable slot of the base is not a frozen value.
	w6, _ := full.Param(other, "6.0.weight")
	w6[0]++
	if again2, _ := m.WithFrozen(other); again2.Hash() != fm.Hash() {
		t.Fatal("a trainable value changed the hash")
	}
	// One bit of one frozen value.
	emb, _ := full.Param(other, "0.weight")
	emb[17] = math.Float32frombits(math.Float32bits(emb[17]) ^ 1)
	if changed, _ := m.WithFrozen(other); changed.Hash() == fm.Hash() {
		t.Fatal("a frozen bit flipped, same hash")
	}
}

// TestFrozenRefusals: patterns that match nothing, split a layer or leave
// nothing to train; a model used before it has its frozen values; frozen
// values of the wrong length or not finite; the CUDA engine.
func TestFrozenRefusals(t *testing.T) {
	spec := bertLike(tinyBERT())
	for _, tc := range []struct {
		trainable, freeze []string
		want              string
	}{
		{[]string{"classifier.*"}, nil, "matches no parameter"},
		{[]string{"*.bias"}, nil, "split a layer"},
		{nil, []string{"6.0.weight"}, "split a layer"},
		{nil, []string{"*"}, "no parameter to train"},
		{[]string{"["}, nil, "not a path.Match pattern"},
	} {
		s := spec
		s.Trainable, s.Freeze = tc.trainable, tc.freeze
		_, err := New(s)
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("trainable %q freeze %q: error %v, want %q", tc.trainable, tc.freeze, err, tc.want)
		}
	}
	spec.Trainable = []string{"13.*"}
	m, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.NewWorkspace(2); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "WithFrozen") {
		t.Errorf("NewWorkspace before WithFrozen: %v", err)
	}
	if err := m.Init(make([]float32, m.NumParams()), 1); err == nil {
		t.Error("Init before WithFrozen succeeded")
	}
	if _, err := m.WithFrozen(make([]float32, m.NumParams())); !errors.Is(err, ErrShape) {
		t.Errorf("WithFrozen of theta's length: %v", err)
	}
	base := make([]float32, m.NumFullParams())
	base[0] = float32(math.NaN())
	if _, err := m.WithFrozen(base); !errors.Is(err, ErrNonFinite) {
		t.Errorf("NaN frozen value: %v", err)
	}
	base[0] = 0
	last := m.FullParams()[len(m.FullParams())-1]
	base[last.Offset] = float32(math.Inf(1)) // the classifier trains: not a frozen value
	fm, err := m.WithFrozen(base)
	if err != nil {
		t.Fatalf("a non-finite trainable slot of the base: %v", err)
	}
	if err := cudaSupports(fm); !errors.Is(err, ErrUnsupportedLayer) || !strings.Contains(err.Error(), "frozen") {
		t.Errorf("CUDA engine on frozen layers: %v", err)
	}
	full, _ := New(bertLike(tinyBERT()))
	if _, err := full.WithFrozen(make([]float32, full.NumParams())); err == nil {
		t.Error("WithFrozen on a model that freezes nothing")
	}
	if full.Freezes() || full.NumFullParams() != full.NumParams() {
		t.Error("a model without patterns freezes")
	}
}

// TestFrozenSkipsLowerLayers: a model that trains only its head has no
// gradient buffers below it (no backward pass runs there: one that did
// would write into a nil buffer and panic), and its clipped sum is the
// head's.
func TestFrozenSkipsLowerLayers(t *testing.T) {
	c := frozenCase{"bert/head", pretrainedCases()[0], []string{"13.*"}, nil}
	_, fm, _ := c.build(t)
	ws, _ := fm.NewWorkspace(4)
	L := len(ws.grad) - 1
	for l := 1; l < L; l++ {
		if ws.grad[l] != nil {
			t.Fatalf("the gradient w.r.t. layer %d's input is allocated; only layer %d trains", l, L-1)
		}
	}
	theta := trainedTheta(t, fm, 1)
	x, y := c.base.batch(4, rand.New(rand.NewPCG(1, 1)))
	sum := make([]float32, fm.NumParams())
	if _, err := ws.ClippedSum(sum, theta, x, y, 1); err != nil {
		t.Fatal(err)
	}
	if !allFinite(sum) || sumSq(sum) == 0 {
		t.Fatalf("head's clipped sum %v", sum[:4])
	}
}

package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// loraCase is a pretrained-shaped model with LoRA adapters.
type loraCase struct {
	name string
	base pretrainedCase
	spec Spec
}

// loraCases put adapters where fine-tuning does: tinyBERT's fused query,
// key and value projection gets adapters on the query and the value
// (parts [0, H) and [2H, 3H)) with the classifier trained; tinyGPT2's
// c_attn the same and its c_proj one adapter over every output, with
// the score trained; and the GPT-2 language model with adapters only.
func loraCases() []loraCase {
	cs := pretrainedCases()
	qv := func(w, rank int) *LoRA {
		return &LoRA{Rank: rank, Alpha: 2 * float64(rank), Parts: []LoRAPart{{"query", 0, w}, {"value", 2 * w, 3 * w}}}
	}
	bert := bertLike(tinyBERT())
	for i := range bert.Layers {
		if l := &bert.Layers[i]; l.Type == Residual && l.Layers[1].Type == Attention {
			l.Layers = slices.Clone(l.Layers)
			l.Layers[0].LoRA = qv(tinyBERT().width, 2)
		}
	}
	bert.Trainable = []string{"13.*"}
	adapt := func(s Spec, width int) Spec {
		for i := range s.Layers {
			if l := &s.Layers[i]; l.Type == Residual && l.Layers[2].Type == Attention {
				l.Layers = slices.Clone(l.Layers)
				l.Layers[1].LoRA = qv(width, 3)
				l.Layers[3].LoRA = &LoRA{Rank: 1}
			}
		}
		return s
	}
	gpt2 := adapt(gpt2Like(tinyGPT2(), false), tinyGPT2().width)
	gpt2.Trainable = []string{"7.*"}
	lm := cs[3]
	return []loraCase{
		{"bert", cs[0], bert},
		{"gpt2", cs[2], gpt2},
		{"gpt2-lm", lm, adapt(lm.spec, tinyGPT2().width)},
	}
}

// build returns the case's model with its frozen values: a random full
// layout, B included (at zero the adapters' A would get no gradient).
func (c loraCase) build(t *testing.T) (*Model, []float32) {
	t.Helper()
	m, err := New(c.spec)
	if err != nil {
		t.Fatal(err)
	}
	base := make([]float32, m.NumFullParams())
	if err := m.InitFull(base, 3); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range base {
		base[i] += float32(0.2 * rng.NormFloat64())
	}
	fm, err := m.WithFrozen(base)
	if err != nil {
		t.Fatal(err)
	}
	return fm, base
}

// TestLoRAGradients: the adapters' mean gradient against central
// differences and against the chain rule through the plain model with
// the adapters merged into its weights (dB = s·dW'[Lo:Hi] Aᵀ, dA =
// s·Bᵀ dW'[Lo:Hi]); the clipped sum against the naive per-example
// reference with either norm strategy, each example's clip norm tight
// above its true norm.
func TestLoRAGradients(t *testing.T) {
	for ci, c := range loraCases() {
		t.Run(c.name, func(t *testing.T) {
			fm, _ := c.build(t)
			theta := trainedTheta(t, fm, uint64(ci))
			const B = 5
			rng := rand.New(rand.NewPCG(uint64(ci), 8))
			x, y := c.base.batch(B, rng)
			checkFiniteDifferences(t, fm, theta, x, y, rng)

			plain, err := New(fm.MergedSpec())
			if err != nil {
				t.Fatal(err)
			}
			merged := make([]float32, plain.NumParams())
			if err := fm.Merged(merged, theta); err != nil {
				t.Fatal(err)
			}
			wp, _ := plain.NewWorkspace(B)
			gw := make([]float32, plain.NumParams())
			lossPlain, err := wp.MeanGrad(gw, merged, x, y)
			if err != nil {
				t.Fatal(err)
			}
			ws, _ := fm.NewWorkspace(B)
			got := make([]float32, fm.NumParams())
			loss, err := ws.MeanGrad(got, theta, x, y)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(loss-lossPlain) > 1e-5*math.Abs(lossPlain) {
				t.Fatalf("loss %v, merged model's %v", loss, lossPlain)
			}
			want := chainRuleLoRA(t, fm, plain, theta, gw)
			if rel := relDiff(got, want); rel > 1e-4 {
				t.Fatalf("adapters' gradient vs the merged model's chain rule: relative difference %.3g", rel)
			}
			checkClipTight(t, fm, theta, x, y, true)
			for _, ghost := range []bool{false, true} {
				m := withConvMode(fm, ghost)
				checkClippedOn(t, m, theta, x, y, B)
				checkClipTight(t, m, theta, x, y, false)
				checkClipAgainstReference(t, m, theta, x, y, 1e-3)
			}
		})
	}
}

// chainRuleLoRA returns, in theta's layout, the gradient of the LoRA
// model fm implied by the plain model's gradient gw at the merged weights:
// the trainable plain tensors as they are, and each adapter pair from its
// layer's weight gradient, computed in float64.
func chainRuleLoRA(t *testing.T, fm, plain *Model, theta, gw []float32) []float32 {
	t.Helper()
	want := make([]float32, fm.NumParams())
	pg := map[string][]float32{}
	for _, p := range plain.Params() {
		v, _ := plain.Param(gw, p.Name)
		pg[p.Name] = v
	}
	for _, p := range fm.Params() {
		dst, _ := fm.Param(want, p.Name)
		if g, ok := pg[p.Name]; ok {
			copy(dst, g)
			continue
		}
		// <layer>.<part>.lora_A or lora_B: find the layer's weight and
		// the part's rows.
		cut := strings.LastIndex(p.Name, ".lora_")
		prefix, which := p.Name[:cut], p.Name[cut+len(".lora_"):]
		ll, part := findLoRA(t, fm, prefix)
		layer := prefix
		if part.name != "" {
			layer = strings.TrimSuffix(prefix, "."+part.name)
		}
		dW := pg[layer+".weight"]
		aName, bName := prefix+".lora_A", prefix+".lora_B"
		a, _ := fm.Param(theta, aName)
		b, _ := fm.Param(theta, bName)
		D, r, s := ll.base.K, part.down.o, float64(ll.scale)
		for o := part.lo; o < part.hi; o++ {
			for k := 0; k < r; k++ {
				for c := 0; c < D; c++ {
					g := float64(dW[o*D+c])
					if which == "A" {
						dst[k*D+c] += float32(s * float64(b[(o-part.lo)*r+k]) * g)
					} else {
						dst[(o-part.lo)*r+k] += float32(s * g * float64(a[k*D+c]))
					}
				}
			}
		}
	}
	return want
}

// findLoRA returns the LoRA layer and part whose adapters are named
// prefix + ".lora_A".
func findLoRA(t *testing.T, m *Model, prefix string) (*loraLinear, loraPart) {
	t.Helper()
	name := map[int]string{}
	for _, p := range m.FullParams() {
		name[p.Offset] = p.Name
	}
	for l, ls := range m.leaves {
		for _, lf := range ls {
			ll := loraAt(m, l, lf.full)
			if ll == nil {
				continue
			}
			n := lf.full + ll.headSize()
			for _, part := range ll.parts {
				if name[n] == prefix+".lora_A" {
					return ll, part
				}
				n += part.down.o*part.down.K + part.up.o*part.up.K
			}
		}
	}
	t.Fatalf("no LoRA adapters %s", prefix)
	return nil, loraPart{}
}

// loraAt returns the LoRA layer of layer l (nested ones included) whose
// parameters start at full, or nil.
func loraAt(m *Model, l, full int) *loraLinear {
	switch ly := m.layers[l].(type) {
	case *loraLinear:
		if m.layerOff[l] == full {
			return ly
		}
	case *residual:
		for j, nl := range ly.layers {
			if ll, ok := nl.(*loraLinear); ok && m.layerOff[l]+ly.off[j] == full {
				return ll
			}
		}
	}
	return nil
}

// TestLoRAStartsAsTheBase: InitFull draws B = 0, so the adapted model's
// outputs are the plain model's with the same base weights, and
// Merged of that theta gives the base weights back.
func TestLoRAStartsAsTheBase(t *testing.T) {
	c := loraCases()[0]
	m, _ := New(c.spec)
	base := make([]float32, m.NumFullParams())
	if err := m.InitFull(base, 11); err != nil {
		t.Fatal(err)
	}
	fm, err := m.WithFrozen(base)
	if err != nil {
		t.Fatal(err)
	}
	theta := make([]float32, fm.NumParams())
	_ = fm.Init(theta, 0)
	for _, p := range fm.Params() {
		v, _ := fm.Param(theta, p.Name)
		if strings.HasSuffix(p.Name, "lora_B") && slices.ContainsFunc(v, func(x float32) bool { return x != 0 }) {
			t.Fatalf("%s starts nonzero", p.Name)
		}
		if strings.HasSuffix(p.Name, "lora_A") && !slices.ContainsFunc(v, func(x float32) bool { return x != 0 }) {
			t.Fatalf("%s starts at zero", p.Name)
		}
	}
	plain, _ := New(fm.MergedSpec())
	merged := make([]float32, plain.NumParams())
	if err := fm.Merged(merged, theta); err != nil {
		t.Fatal(err)
	}
	for _, p := range plain.Params() {
		got, _ := plain.Param(merged, p.Name)
		src := base[fullOffset(t, fm, p.Name):]
		if !slices.Equal(got, src[:p.Size]) {
			t.Fatalf("Merged %s is not the base's", p.Name)
		}
	}
	x, _ := c.base.batch(3, rand.New(rand.NewPCG(1, 2)))
	w1, _ := fm.NewWorkspace(3)
	w2, _ := plain.NewWorkspace(3)
	l1, l2 := make([]float32, 3*fm.Classes()), make([]float32, 3*fm.Classes())
	if err := w1.Logits(l1, theta, x); err != nil {
		t.Fatal(err)
	}
	if err := w2.Logits(l2, merged, x); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l1, l2) {
		t.Fatalf("logits with B = 0 differ from the plain model's: %v vs %v", l1, l2)
	}
}

// fullOffset returns the named parameter's offset in m's full layout.
func fullOffset(t *testing.T, m *Model, name string) int {
	for _, p := range m.FullParams() {
		if p.Name == name {
			return p.Offset
		}
	}
	t.Fatalf("no parameter %s", name)
	return 0
}

// TestLoRALayout: theta holds the adapters and what Trainable names; the
// base weights of the adapted layers are frozen even when a Trainable
// pattern matches them; Freeze can freeze adapters.
func TestLoRALayout(t *testing.T) {
	c := loraCases()[0]
	m, _ := New(c.spec)
	var names []string
	for _, p := range m.Params() {
		names = append(names, p.Name)
	}
	want := []string{"2.0.query.lora_A", "2.0.query.lora_B", "2.0.value.lora_A", "2.0.value.lora_B",
		"6.0.query.lora_A", "6.0.query.lora_B", "6.0.value.lora_A", "6.0.value.lora_B", "13.weight", "13.bias"}
	if !slices.Equal(names, want) {
		t.Fatalf("trainable %v, want %v", names, want)
	}
	s := c.spec
	s.Trainable = []string{"6.*", "13.*"}
	m2, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	if m2.Trainable("6.0.weight") || !m2.Trainable("6.2.weight") || !m2.Trainable("2.0.query.lora_A") {
		t.Fatal("a LoRA base trains, or a named layer or an adapter does not")
	}
	s.Freeze = []string{"2.*"}
	m3, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	if m3.Trainable("2.0.query.lora_A") || !m3.Trainable("6.0.value.lora_B") {
		t.Fatal("Freeze does not freeze adapters")
	}
	s.Freeze = []string{"2.0.query.*"}
	if _, err := New(s); err == nil || !strings.Contains(err.Error(), "split a layer") {
		t.Fatalf("freezing one part's adapters: %v", err)
	}
	if cudaSupports(m) == nil {
		t.Fatal("the CUDA engine accepts LoRA")
	}
}

// TestLoRARefusals: the rank, the parts and the layer kind.
func TestLoRARefusals(t *testing.T) {
	seq := func(lr *LoRA, noBias bool) Spec {
		return Spec{Name: "s", Input: []int{4}, Classes: 2, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 10, Dim: 6},
			{Type: Linear, Out: 6, LoRA: lr, NoBias: noBias},
			{Type: MeanPool}, {Type: Linear, Out: 2}}}
	}
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{seq(&LoRA{Rank: 0}, false), "rank 0"},
		{seq(&LoRA{Rank: 7}, false), "rank 7"},
		{seq(&LoRA{Rank: 2, Alpha: -1}, false), "alpha"},
		{seq(&LoRA{Rank: 2, Parts: []LoRAPart{{"a", 0, 7}}}, false), "not inside"},
		{seq(&LoRA{Rank: 2, Parts: []LoRAPart{{"a", 0, 4}, {"b", 3, 6}}}, false), "overlap"},
		{seq(&LoRA{Rank: 2, Parts: []LoRAPart{{"a", 0, 2}, {"a", 3, 6}}}, false), "used twice"},
		{seq(&LoRA{Rank: 2}, true), "without bias"},
		{Spec{Name: "f", Input: []int{4}, Classes: 2, Layers: []LayerSpec{{Type: Linear, Out: 2, LoRA: &LoRA{Rank: 1}}}}, "sequences"},
		{Spec{Name: "r", Input: []int{4}, Classes: 2, Layers: []LayerSpec{{Type: ReLU, LoRA: &LoRA{Rank: 1}}, {Type: Linear, Out: 2}}}, `"lora" is not used`},
	} {
		_, err := New(tc.spec)
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.spec.Layers[min(1, len(tc.spec.Layers)-1)].LoRA, err, tc.want)
		}
	}
	m, err := New(seq(&LoRA{Rank: 2}, false))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%s %v %s %v", m.Params()[0].Name, m.Params()[0].Shape, m.Params()[1].Name, m.Params()[1].Shape); got != "1.lora_A [2 6] 1.lora_B [6 2]" {
		t.Errorf("adapters of one part: %s", got)
	}
}

// TestLoRAClipAdversarial: huge token embeddings in the frozen base: each
// example's clipped adapter gradient stays within C.
func TestLoRAClipAdversarial(t *testing.T) {
	c := loraCases()[0]
	m, _ := New(c.spec)
	base := make([]float32, m.NumFullParams())
	_ = m.InitFull(base, 2)
	emb := m.FullParams()[0]
	for i := emb.Offset; i < emb.Offset+emb.Size; i++ {
		base[i] *= 1e4
	}
	fm, err := m.WithFrozen(base)
	if err != nil {
		t.Fatal(err)
	}
	theta := trainedTheta(t, fm, 4)
	x, y := c.base.batch(6, rand.New(rand.NewPCG(9, 9)))
	checkClipAgainstReference(t, fm, theta, x, y, 1e-3)
	ws, _ := fm.NewWorkspace(1)
	sum := make([]float32, fm.NumParams())
	for i := range y {
		if _, err := ws.ClippedSum(sum, theta, x[i*8:(i+1)*8], y[i:i+1], 1e-3); err != nil {
			t.Fatal(err)
		}
		if n := math.Sqrt(sumSq(sum)); n > 1e-3 {
			t.Fatalf("example %d: ‖clipped gradient‖ = %v > C", i, n)
		}
	}
}

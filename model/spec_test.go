package model

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPresetsShapes(t *testing.T) {
	tests := []struct {
		name   string
		params int
		names  []string
	}{
		{"logreg", 784*10 + 10, []string{"1.weight", "1.bias"}},
		{"mlp", 784*256 + 256 + 256*256 + 256 + 256*10 + 10, []string{"1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias"}},
		// conv1 16·1·8·8+16, conv2 32·16·4·4+32, linear 512→32, linear 32→10
		{"cnn", 16*64 + 16 + 32*256 + 32 + 32*512 + 32 + 32*10 + 10, []string{"0.weight", "0.bias", "3.weight", "3.bias", "7.weight", "7.bias", "9.weight", "9.bias"}},
		{"textbag", 10000*64 + 64*64 + 64 + 64*4 + 4, []string{"0.weight", "1.weight", "1.bias", "3.weight", "3.bias"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := Preset(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			m, err := New(spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.NumParams(); got != tc.params {
				t.Errorf("NumParams = %d, want %d", got, tc.params)
			}
			var names []string
			off := 0
			for _, p := range m.Params() {
				names = append(names, p.Name)
				if p.Offset != off || p.Size != shapeSize(p.Shape) {
					t.Errorf("param %s: offset %d size %d shape %v, want offset %d", p.Name, p.Offset, p.Size, p.Shape, off)
				}
				off += p.Size
			}
			if !slices.Equal(names, tc.names) {
				t.Errorf("param names = %v, want %v", names, tc.names)
			}
		})
	}
	if _, err := Preset("resnet"); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("unknown preset: %v", err)
	}
}

func TestCNNConvShapes(t *testing.T) {
	m, err := New(CNN([]int{1, 28, 28}, 10))
	if err != nil {
		t.Fatal(err)
	}
	var got [][]int
	for _, l := range m.layers {
		got = append(got, l.outShape())
	}
	want := [][]int{{16, 14, 14}, {16, 14, 14}, {16, 13, 13}, {32, 5, 5}, {32, 5, 5}, {32, 4, 4}, {512}, {32}, {32}, {10}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("layer shapes = %v, want %v", got, want)
	}
	// Cost model: conv1 (T=196, K=64, O=16) and conv2 (T=25, K=256, O=32)
	// materialize (T²(K+O) ≫ O·K), while issue 11's 1×1 conv over two
	// positions (T=2, K=64, O=8) uses the ghost norm.
	if m.layers[0].(*conv).ghost || m.layers[3].(*conv).ghost {
		t.Fatal("unexpected per-layer norm strategy")
	}
	mc, err := New(cancelSpec())
	if err != nil {
		t.Fatal(err)
	}
	if !mc.layers[0].(*conv).ghost {
		t.Fatal("a conv over two output positions does not use the ghost norm")
	}
}

func TestSpecHash(t *testing.T) {
	spec, _ := Preset("mlp")
	h1, err := spec.Hash()
	if err != nil {
		t.Fatal(err)
	}
	// Pinned: changing the canonical encoding breaks cross-version checks.
	const want = "a68ee4372853da0e63b54941110e8489f64dbe976bd1da329d860b2f4012cd7f"
	if h1 != want {
		t.Errorf("mlp hash = %s, want %s", h1, want)
	}
	// Defaults written out explicitly hash the same.
	cnn, _ := Preset("cnn")
	explicit := cnn
	explicit.Layers = slices.Clone(cnn.Layers)
	explicit.Loss = SoftmaxCrossEntropy
	explicit.Layers[2].Stride = 1
	explicit.Layers[0].Stride = 2
	ha, _ := cnn.Hash()
	hb, _ := explicit.Hash()
	if ha != hb {
		t.Errorf("explicit defaults change the hash")
	}
	// Any change in architecture changes the hash.
	other := MLP([]int{1, 28, 28}, []int{256, 128}, 10)
	if h2, _ := other.Hash(); h2 == h1 {
		t.Errorf("different models share a hash")
	}
	// JSON round trip keeps the hash.
	b, err := spec.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if h3, _ := back.Hash(); h3 != h1 {
		t.Errorf("round trip changed the hash: %s", b)
	}
	if !strings.HasPrefix(string(b), `{"classes":10,"input":[1,28,28],"layers":[{"type":"flatten"}`) {
		t.Errorf("canonical JSON = %s", b)
	}
	if m, _ := New(spec); m.Hash() != h1 {
		t.Errorf("Model.Hash differs from Spec.Hash")
	}
	// Pinned too: LayerSpec's optional fields are left out of the
	// canonical JSON when unset (omitempty), so every spec written before
	// one of them existed keeps its hash.
	for name, want := range map[string]string{
		"logreg":      "8f4d2663dab8963ae987751b3e8cc4284b6f1f8bfcbc1b9a29acaaaccdeb8507",
		"cnn":         "480a925a64a29538bb33e18ee23220190666bfe99343e8571e6cd146f639b561",
		"textbag":     "fb08ee2eab1e54c3d677702374a2f92432f05e4010c09e923a7b93cebe999fe7",
		"transformer": "c213c0c3eb604a1f9f37b50ce4181cdad938aa585ffdb5ec25eb493956d1aa90",
	} {
		s, _ := Preset(name)
		if h, _ := s.Hash(); h != want {
			t.Errorf("%s hash = %s, want %s", name, h, want)
		}
	}
	if h, _ := TransformerClassifier(9, 6, 4, 1, 2, 3).Hash(); h != "3e5f5511a54729a996c8ed67b4712fa319164831bc7c23add04294559e846fcb" {
		t.Errorf("TransformerClassifier(9, 6, 4, 1, 2, 3) hash = %s", h)
	}
}

func TestParseSpecErrors(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"unknown field", `{"input":[4],"classes":2,"layers":[{"type":"linear","out":2}],"extra":1}`, "unknown field"},
		{"unknown layer", `{"input":[4],"classes":2,"layers":[{"type":"dense","out":2}]}`, `unknown layer type "dense"`},
		{"missing type", `{"input":[4],"classes":2,"layers":[{"out":2}]}`, "missing layer type"},
		{"linear on image", `{"input":[1,4,4],"classes":2,"layers":[{"type":"linear","out":2}]}`, "add a flatten layer"},
		{"wrong output", `{"input":[4],"classes":3,"layers":[{"type":"linear","out":2}]}`, "want [3]"},
		{"kernel too big", `{"input":[1,4,4],"classes":2,"layers":[{"type":"conv2d","out":2,"kernel":5},{"type":"flatten"},{"type":"linear","out":2}]}`, "kernel 5 larger"},
		{"pool too big", `{"input":[1,4,4],"classes":2,"layers":[{"type":"maxpool","kernel":5},{"type":"flatten"},{"type":"linear","out":2}]}`, "kernel ≤ H"},
		{"irrelevant field", `{"input":[4],"classes":2,"layers":[{"type":"linear","out":2,"kernel":3}]}`, `field "kernel" is not used by linear`},
		{"embedding not first", `{"input":[4],"classes":2,"layers":[{"type":"linear","out":4},{"type":"embeddingbag","vocab":3,"dim":2},{"type":"linear","out":2}]}`, "must be the first layer"},
		{"no params", `{"input":[2],"classes":2,"layers":[{"type":"relu"}]}`, "no parameters"},
		{"bad input", `{"input":[2,3],"classes":2,"layers":[{"type":"flatten"},{"type":"linear","out":2}]}`, "must be [D] or [C, H, W]"},
		{"zero input", `{"input":[0],"classes":2,"layers":[{"type":"linear","out":2}]}`, "non-positive"},
		{"one class", `{"input":[2],"classes":1,"layers":[{"type":"linear","out":1}]}`, "classes = 1"},
		{"bad loss", `{"input":[2],"classes":2,"loss":"mse","layers":[{"type":"linear","out":2}]}`, "unknown loss"},
		{"bad eps", `{"input":[2],"classes":2,"layers":[{"type":"layernorm","eps":-1},{"type":"linear","out":2}]}`, "eps = -1"},
		{"huge", `{"input":[100000,100000,100000],"classes":2,"layers":[{"type":"flatten"},{"type":"linear","out":2}]}`, "huge"},
		{"duplicate names", `{"input":[2],"classes":2,"layers":[{"type":"linear","out":2,"name":"a"},{"type":"linear","out":2,"name":"a"}]}`, "duplicate parameter"},
		{"trailing", `{"input":[2],"classes":2,"layers":[{"type":"linear","out":2}]} {}`, "trailing"},
		{"not json", `[1,2`, "invalid spec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(tc.json))
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("error %v does not wrap ErrInvalidSpec", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestInitDeterministic(t *testing.T) {
	spec, _ := Preset("cnn")
	m, _ := New(spec)
	a := make([]float32, m.NumParams())
	b := make([]float32, m.NumParams())
	c := make([]float32, m.NumParams())
	if err := m.Init(a, 7); err != nil {
		t.Fatal(err)
	}
	_ = m.Init(b, 7)
	_ = m.Init(c, 8)
	if !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatal("Init is not a deterministic function of the seed")
	}
	// PyTorch-style bounds: conv1 weights within 1/sqrt(64).
	w, ok := m.Param(a, "0.weight")
	if !ok || len(w) != 1024 {
		t.Fatal("Param(0.weight) missing")
	}
	for _, v := range w {
		if math.Abs(float64(v)) > 1.0/8 {
			t.Fatalf("conv1 weight %v outside ±1/8", v)
		}
	}
	if err := m.Init(a[1:], 7); !errors.Is(err, ErrShape) {
		t.Fatalf("short Init: %v", err)
	}
}

// FuzzParseSpec: arbitrary bytes never panic; an accepted spec builds a
// model whose hash survives a canonical round trip, and small ones run.
func FuzzParseSpec(f *testing.F) {
	for _, name := range Presets() {
		s, _ := Preset(name)
		b, _ := s.CanonicalJSON()
		f.Add(b)
	}
	f.Add([]byte(`{"input":[2,5,5],"classes":2,"layers":[{"type":"conv2d","out":2,"kernel":3,"pad":1},{"type":"avgpool","kernel":2},{"type":"flatten"},{"type":"layernorm"},{"type":"linear","out":2}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSpec(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("error %v does not wrap ErrInvalidSpec", err)
			}
			return
		}
		m, err := New(s)
		if err != nil {
			t.Fatalf("ParseSpec accepted a spec New rejects: %v", err)
		}
		b, err := s.CanonicalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseSpec(b)
		if err != nil {
			t.Fatalf("canonical JSON does not parse: %v", err)
		}
		if h, _ := back.Hash(); h != m.Hash() {
			t.Fatal("hash changed in a canonical round trip")
		}
		if m.NumParams() > 1<<16 || m.InputSize() > 1<<12 {
			return
		}
		ws, err := m.NewWorkspace(2)
		if err != nil {
			t.Fatal(err)
		}
		theta := make([]float32, m.NumParams())
		_ = m.Init(theta, 1)
		x := make([]float32, 2*m.InputSize())
		dst := make([]float32, m.NumParams())
		if _, err := ws.ClippedSum(dst, theta, x, []int32{0, 1}, 1); err != nil && !errors.Is(err, ErrNonFinite) {
			t.Fatal(err)
		}
	})
}

// TestPresetForShapesByData: a preset takes its input shape, classes and
// vocabulary from the data, and refuses data it cannot take with an
// error naming the preset and the shape.
func TestPresetForShapesByData(t *testing.T) {
	for _, tc := range []struct {
		name         string
		input        []int
		classes, voc int
		params       int    // the built model's parameter count; 0 with an error
		err          string // substring of the error
	}{
		{"logreg", []int{20}, 3, 0, 20*3 + 3, ""},
		{"mlp", []int{20}, 3, 0, (20*256 + 256) + (256*256 + 256) + (256*3 + 3), ""},
		{"mlp", []int{3, 8, 8}, 2, 0, (192*256 + 256) + (256*256 + 256) + (256*2 + 2), ""},
		{"cnn", []int{3, 32, 32}, 5, 0, -1, ""},
		{"cnn", []int{20}, 3, 0, 0, "needs images of shape [C, H, W]"},
		{"cnn", []int{1, 4, 4}, 3, 0, 0, "H, W ≥ 8"},
		{"textbag", []int{32}, 4, 500, 500*64 + (64*64 + 64) + (64*4 + 4), ""},
		{"textbag", []int{20}, 3, 0, 0, "needs token sequences"},
		{"mlp", []int{32}, 4, 500, 0, "token sequences (vocabulary 500)"},
		{"mlp", []int{20}, 0, 0, 0, "0 classes"},
		{"mlp", []int{0}, 2, 0, 0, "not a shape"},
		{"resnet", []int{20}, 2, 0, 0, "unknown preset"},
	} {
		spec, err := PresetFor(tc.name, tc.input, tc.classes, tc.voc)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("PresetFor(%s, %v, %d, %d) error %v, want one containing %q", tc.name, tc.input, tc.classes, tc.voc, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("PresetFor(%s, %v): %v", tc.name, tc.input, err)
		}
		m, err := New(spec)
		if err != nil {
			t.Fatalf("PresetFor(%s, %v): New: %v", tc.name, tc.input, err)
		}
		if tc.params > 0 && m.NumParams() != tc.params {
			t.Errorf("PresetFor(%s, %v): %d parameters, want %d", tc.name, tc.input, m.NumParams(), tc.params)
		}
		if !slices.Equal(m.InputShape(), tc.input) || m.Classes() != tc.classes {
			t.Errorf("PresetFor(%s, %v, %d): model input %v, %d classes", tc.name, tc.input, tc.classes, m.InputShape(), m.Classes())
		}
	}
	// The Fashion-MNIST presets are PresetFor on its shape.
	for _, name := range []string{"logreg", "mlp", "cnn"} {
		a, _ := Preset(name)
		b, _ := PresetFor(name, []int{1, 28, 28}, 10, 0)
		ha, _ := a.Hash()
		hb, _ := b.Hash()
		if ha != hb {
			t.Errorf("Preset(%s) and PresetFor(%s, [1 28 28], 10) differ", name, name)
		}
	}
}

// TestSpecParamLayout: the parameters a layer's optional fields give, by
// name and shape, in order.
func TestSpecParamLayout(t *testing.T) {
	for _, c := range []struct {
		name string
		spec Spec
		want string
	}{
		{"no_bias", Spec{Input: []int{4}, Classes: 3, Layers: []LayerSpec{
			{Type: Linear, Out: 5, NoBias: true}, {Type: Linear, Out: 3}}},
			"0.weight[5 4] 1.weight[3 5] 1.bias[3]"},
		{"seq no_bias", Spec{Input: []int{6}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 7, Dim: 4}, {Type: Linear, Out: 5, NoBias: true}, {Type: MeanPool}, {Type: Linear, Out: 3, NoBias: true}}},
			"0.weight[7 4] 0.pos[6 4] 1.weight[5 4] 3.weight[3 5]"},
		{"embedding tables", Spec{Input: []int{6}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 7, Dim: 4, Positions: 10, PosOffset: 2, Types: 2, TypeSep: intPtr(3)}, {Type: MeanPool}, {Type: Linear, Out: 3}}},
			"0.weight[7 4] 0.pos[10 4] 0.types[2 4] 2.weight[3 4] 2.bias[3]"},
		{"embedding one type, next token", Spec{Input: []int{6}, Classes: 7, Loss: NextToken, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 7, Dim: 4, Positions: 5, Types: 1}, {Type: Linear, Out: 7}}},
			"0.weight[7 4] 0.pos[5 4] 0.types[1 4] 1.weight[7 4] 1.bias[7]"},
	} {
		m, err := New(c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got []string
		for _, p := range m.Params() {
			got = append(got, fmt.Sprintf("%s%v", p.Name, p.Shape))
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%s: parameters %s, want %s", c.name, g, c.want)
		}
	}
}

// TestSpecFieldErrors: each optional field is refused, naming it, on the
// layer types that do not use it, and bad values are refused naming the
// problem.
func TestSpecFieldErrors(t *testing.T) {
	emb := LayerSpec{Type: Embedding, Vocab: 5, Dim: 4}
	checkSpecErrors(t, []specErrorCase{
		{"no_bias on relu", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{{Type: Linear, Out: 2}, {Type: ReLU, NoBias: true}}}, `field "no_bias" is not used by relu`},
		{"no_bias on conv2d", Spec{Input: []int{1, 4, 4}, Classes: 2, Layers: []LayerSpec{{Type: Conv2D, Out: 2, Kernel: 2, NoBias: true}, {Type: Flatten}, {Type: Linear, Out: 2}}}, `field "no_bias" is not used by conv2d`},
		{"no_bias on embedding", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, NoBias: true}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, `field "no_bias" is not used by embedding`},
		{"no_bias nested", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{emb, {Type: Residual, Layers: []LayerSpec{{Type: LayerNorm, NoBias: true}}}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, `field "no_bias" is not used by layernorm`},
		{"positions on embeddingbag", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{{Type: EmbeddingBag, Vocab: 5, Dim: 4, Positions: 3}, {Type: Linear, Out: 2}}}, `field "positions" is not used by embeddingbag`},
		{"pos_offset on linear", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{{Type: Linear, Out: 2, PosOffset: 1}}}, `field "pos_offset" is not used by linear`},
		{"types on attention", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{emb, {Type: Linear, Out: 12}, {Type: Attention, Heads: 2, Types: 2}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, `field "types" is not used by attention`},
		{"type_sep on layernorm", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{emb, {Type: LayerNorm, TypeSep: intPtr(0)}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, `field "type_sep" is not used by layernorm`},
		{"positions below T", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, Positions: 5}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "positions ≥ T + pos_offset = 6 + 0"},
		{"offset past the table", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, Positions: 7, PosOffset: 2}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "positions ≥ T + pos_offset = 6 + 2"},
		{"offset without positions", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, PosOffset: 2}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "0 means T"},
		{"negative offset", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, PosOffset: -1}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "pos_offset ≥ 0"},
		{"negative positions", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, Positions: -6}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "got positions -6"},
		{"negative types", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, Types: -1}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "types = -1"},
		{"types without type_sep", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, Types: 2}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "needs type_sep"},
		{"type_sep with one type", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, Types: 1, TypeSep: intPtr(2)}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "type_sep needs types ≥ 2"},
		{"type_sep without types", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, TypeSep: intPtr(2)}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "type_sep needs types ≥ 2"},
		{"type_sep past vocab", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 4, Types: 2, TypeSep: intPtr(5)}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "type_sep = 5"},
		{"mask on linear", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{emb, {Type: Linear, Out: 12, Mask: MaskPadding}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, `field "mask" is not used by linear`},
		{"mask on meanpool", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{emb, {Type: MeanPool, Mask: MaskCausal}, {Type: Linear, Out: 2}}}, `field "mask" is not used by meanpool`},
		{"unknown mask", Spec{Input: []int{3}, Classes: 2, Layers: []LayerSpec{emb, {Type: Linear, Out: 12}, {Type: Attention, Heads: 2, Mask: "bidirectional"}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, `mask "bidirectional": want "causal" (the default) or "padding"`},
		{"huge positions", Spec{Input: []int{6}, Classes: 2, Layers: []LayerSpec{{Type: Embedding, Vocab: 5, Dim: 1 << 20, Positions: 1 << 20}, {Type: MeanPool}, {Type: Linear, Out: 2}}}, "too large"},
	})
}

// TestSpecOptionalFieldsJSON: the optional fields parse from their JSON
// names, survive a canonical round trip with the same hash, change the
// hash when set, and the model keeps its own copy of type_sep.
func TestSpecOptionalFieldsJSON(t *testing.T) {
	const js = `{"input":[8],"classes":2,"layers":[` +
		`{"type":"embedding","vocab":50,"dim":4,"positions":12,"pos_offset":2,"types":2,"type_sep":0},` +
		`{"type":"residual","layers":[{"type":"linear","out":12},{"type":"attention","heads":2,"mask":"padding"},{"type":"linear","out":4}]},` +
		`{"type":"linear","out":4,"no_bias":true},{"type":"meanpool"},{"type":"linear","out":2}]}`
	s, err := ParseSpec([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	e := s.Layers[0]
	if e.Positions != 12 || e.PosOffset != 2 || e.Types != 2 || e.TypeSep == nil || *e.TypeSep != 0 ||
		s.Layers[1].Layers[1].Mask != MaskPadding || !s.Layers[2].NoBias {
		t.Fatalf("parsed %+v", s.Layers[:3])
	}
	b, err := s.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"positions":12`, `"pos_offset":2`, `"types":2`, `"type_sep":0`, `"no_bias":true`, `"mask":"padding"`} {
		if !strings.Contains(string(b), f) {
			t.Errorf("canonical JSON %s lacks %s", b, f)
		}
	}
	back, err := ParseSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := s.Hash()
	if hb, _ := back.Hash(); hb != h {
		t.Errorf("round trip changed the hash")
	}
	other := s
	other.Layers = slices.Clone(s.Layers)
	other.Layers[0].TypeSep = intPtr(1)
	if ho, _ := other.Hash(); ho == h {
		t.Errorf("type_sep does not change the hash")
	}
	m, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	*s.Layers[0].TypeSep = 7
	if got := *m.Spec().Layers[0].TypeSep; got != 0 {
		t.Errorf("the model's type_sep follows the caller's pointer: %d", got)
	}
}

package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
)

// gradCases are small models that exercise every layer type's forward and
// backward, including the input gradient of each layer (a parameter layer
// sits below every parameter-free layer): the cases every engine runs,
// then cpuOnlyCases.
func gradCases() []Spec { return append(engineCases(), cpuOnlyCases()...) }

// cpuOnlyCases are the gradient cases with the layers and fields only the
// CPU engines run (the CUDA engine refuses them: TestCUDASupports).
func cpuOnlyCases() []Spec {
	return []Spec{
		{Name: "gelu", Input: []int{4}, Classes: 3, Layers: []LayerSpec{{Type: Linear, Out: 6}, {Type: GELU}, {Type: Linear, Out: 3}}},
		{Name: "gelu_tanh", Input: []int{4}, Classes: 3, Layers: []LayerSpec{{Type: Linear, Out: 6}, {Type: GELUTanh}, {Type: Linear, Out: 3}}},
		{Name: "no_bias", Input: []int{4}, Classes: 3, Layers: []LayerSpec{{Type: Linear, Out: 6, NoBias: true}, {Type: Tanh}, {Type: Linear, Out: 3, NoBias: true}}},
		{Name: "seq-no_bias", Input: []int{5}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 6, Dim: 4}, {Type: Linear, Out: 5, NoBias: true}, {Type: GELUTanh},
			{Type: MeanPool}, {Type: Linear, Out: 3, NoBias: true}}},
		{Name: "embedding-types", Input: []int{7}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 6, Dim: 4, Positions: 11, PosOffset: 2, Types: 3, TypeSep: intPtr(5)},
			{Type: Linear, Out: 5}, {Type: Tanh}, {Type: MeanPool}, {Type: Linear, Out: 3}}},
		{Name: "embedding-one-type", Input: []int{6}, Classes: 4, Loss: NextToken, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 4, Dim: 4, Positions: 9, PosOffset: 2, Types: 1},
			{Type: Residual, Layers: []LayerSpec{{Type: LayerNorm}, {Type: Linear, Out: 12}, {Type: Attention, Heads: 2}, {Type: Linear, Out: 4}}},
			{Type: Linear, Out: 4}}},
		{Name: "attention-padding", Input: []int{6}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 5, Dim: 4},
			{Type: Residual, Layers: []LayerSpec{{Type: Linear, Out: 12}, {Type: Attention, Heads: 2, Mask: MaskPadding}, {Type: Linear, Out: 4}}},
			{Type: LayerNorm}, {Type: MeanPool}, {Type: Linear, Out: 3}}},
		{Name: "firsttoken", Input: []int{5}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 6, Dim: 4}, {Type: Linear, Out: 4}, {Type: Tanh}, {Type: FirstToken}, {Type: Linear, Out: 3}}},
		{Name: "lasttoken", Input: []int{6}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 5, Dim: 4},
			{Type: Residual, Layers: []LayerSpec{{Type: Linear, Out: 12}, {Type: Attention, Heads: 2}, {Type: Linear, Out: 4}}},
			{Type: LastToken}, {Type: Linear, Out: 3, NoBias: true}}},
	}
}

func intPtr(v int) *int { return &v }

// engineCases are the gradient cases every engine runs.
func engineCases() []Spec {
	return []Spec{
		{Name: "linear", Input: []int{5}, Classes: 3, Layers: []LayerSpec{{Type: Flatten}, {Type: Linear, Out: 3}}},
		{Name: "relu", Input: []int{4}, Classes: 3, Layers: []LayerSpec{{Type: Linear, Out: 6}, {Type: ReLU}, {Type: Linear, Out: 3}}},
		{Name: "tanh", Input: []int{4}, Classes: 2, Layers: []LayerSpec{{Type: Linear, Out: 5}, {Type: Tanh}, {Type: Linear, Out: 2}}},
		{Name: "layernorm", Input: []int{4}, Classes: 3, Layers: []LayerSpec{{Type: Linear, Out: 6}, {Type: LayerNorm}, {Type: Linear, Out: 3}}},
		{Name: "conv", Input: []int{2, 6, 5}, Classes: 3, Layers: []LayerSpec{
			{Type: Conv2D, Out: 3, Kernel: 3, Stride: 2, Pad: 1}, {Type: Tanh}, {Type: Flatten}, {Type: Linear, Out: 3}}},
		{Name: "conv-conv", Input: []int{2, 7, 7}, Classes: 2, Layers: []LayerSpec{
			{Type: Conv2D, Out: 3, Kernel: 3}, {Type: ReLU}, {Type: Conv2D, Out: 2, Kernel: 2, Stride: 2, Pad: 1}, {Type: Flatten}, {Type: Linear, Out: 2}}},
		{Name: "maxpool", Input: []int{1, 6, 6}, Classes: 3, Layers: []LayerSpec{
			{Type: Conv2D, Out: 2, Kernel: 2}, {Type: MaxPool, Kernel: 2, Stride: 1}, {Type: Flatten}, {Type: Linear, Out: 3}}},
		{Name: "avgpool", Input: []int{3, 6, 6}, Classes: 3, Layers: []LayerSpec{
			{Type: Conv2D, Out: 2, Kernel: 2}, {Type: AvgPool, Kernel: 2}, {Type: Flatten}, {Type: Linear, Out: 3}}},
		{Name: "embeddingbag", Input: []int{5}, Classes: 3, Layers: []LayerSpec{
			{Type: EmbeddingBag, Vocab: 7, Dim: 4}, {Type: Linear, Out: 3}}},
		{Name: "image-flatten", Input: []int{2, 3, 4}, Classes: 3, Layers: []LayerSpec{
			{Type: MaxPool, Kernel: 2, Stride: 1}, {Type: Flatten}, {Type: Linear, Out: 3}}},
		TextBag(9, 4, 5, 3, 6),
		CNN([]int{1, 28, 28}, 10),
		TransformerLM(7, 5, 4, 1, 2),
		TransformerClassifier(9, 6, 4, 1, 2, 3),
		{Name: "seq-embed-linear", Input: []int{4}, Classes: 3, Layers: []LayerSpec{
			{Type: Embedding, Vocab: 5, Dim: 3}, {Type: Linear, Out: 5}, {Type: Tanh},
			{Type: Residual, Layers: []LayerSpec{{Type: LayerNorm}, {Type: Linear, Out: 5}}},
			{Type: MeanPool}, {Type: Linear, Out: 3}}},
	}
}

// TestMeanGradFiniteDifferences checks every layer's backward pass (float32)
// against central differences of the independent float64 reference.
func TestMeanGradFiniteDifferences(t *testing.T) {
	for ci, spec := range gradCases() {
		t.Run(spec.Name, func(t *testing.T) {
			m, err := New(spec)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(ci), 1))
			theta := randomTheta(t, m, uint64(ci))
			x, y := randomBatch(m, 3, rng)
			checkFiniteDifferences(t, m, theta, x, y, rng)
		})
	}
}

// checkFiniteDifferences checks MeanGrad's loss and gradient on the batch
// against the float64 reference: the loss to 1e-5 relative, the gradient
// against central differences of the reference loss, on every
// coordinate of a small model and on 120 drawn by rng of a big one.
func checkFiniteDifferences(t *testing.T, m *Model, theta, x []float32, y []int32, rng *rand.Rand) {
	t.Helper()
	ws, err := m.NewWorkspace(len(y))
	if err != nil {
		t.Fatal(err)
	}
	g := make([]float32, m.NumParams())
	loss, err := ws.MeanGrad(g, theta, x, y)
	if err != nil {
		t.Fatal(err)
	}
	// The reference runs on the full layout; coordinate i of theta is
	// idx[i] there (the identity unless layers are frozen).
	full := theta
	idx := make([]int, len(theta))
	for i := range idx {
		idx[i] = i
	}
	if m.Freezes() {
		full = make([]float32, m.NumFullParams())
		if err := m.Merge(full, theta); err != nil {
			t.Fatal(err)
		}
		at := map[string]int{}
		for _, p := range m.FullParams() {
			at[p.Name] = p.Offset
		}
		for _, p := range m.Params() {
			for k := range p.Size {
				idx[p.Offset+k] = at[p.Name] + k
			}
		}
	}
	th64 := make([]float64, len(full))
	for i, v := range full {
		th64[i] = float64(v)
	}
	if want := refLoss(t, m, th64, x, y); math.Abs(loss-want) > 1e-5*math.Max(1, math.Abs(want)) {
		t.Fatalf("loss = %v, reference %v", loss, want)
	}
	// All coordinates for small models, a random subset for big ones.
	coords := make([]int, 0, len(theta))
	for i := range theta {
		coords = append(coords, i)
	}
	if len(coords) > 120 {
		rng.Shuffle(len(coords), func(i, j int) { coords[i], coords[j] = coords[j], coords[i] })
		coords = coords[:120]
	}
	// Central differences: error O(h²·f'''); h = 1e-5 in float64
	// keeps truncation and rounding (≈1e-16/h) both below 1e-9.
	const h = 1e-5
	var diff2, ref2, maxRef float64
	for _, j := range coords {
		f := idx[j]
		old := th64[f]
		th64[f] = old + h
		lp := refLoss(t, m, th64, x, y)
		th64[f] = old - h
		lm := refLoss(t, m, th64, x, y)
		th64[f] = old
		fd := (lp - lm) / (2 * h)
		d := float64(g[j]) - fd
		diff2 += d * d
		ref2 += fd * fd
		maxRef = math.Max(maxRef, math.Abs(fd))
	}
	// float32 backward vs float64 reference: relative 1e-3 in norm.
	if rel := math.Sqrt(diff2 / ref2); !(rel < 1e-3) {
		t.Errorf("relative gradient error %.3g over %d coordinates (‖fd‖ = %.3g)", rel, len(coords), math.Sqrt(ref2))
	}
	if maxRef == 0 {
		t.Errorf("finite-difference gradient is identically zero: test is vacuous")
	}
}

// withConvMode returns a copy of m whose conv layers all use the ghost norm
// (ghost = true) or all materialize per-example gradients.
func withConvMode(m *Model, ghost bool) *Model {
	c := *m
	c.layers = slices.Clone(m.layers)
	for i, l := range c.layers {
		c.layers[i] = withGhost(l, ghost)
	}
	return &c
}

// eachConvMode runs f as a subtest "name/ghost=…" for every spec, with
// its conv layers materializing per-example gradients and then taking the
// ghost norm (withConvMode), on the pure-Go back end.
func eachConvMode(t *testing.T, specs []Spec, f func(t *testing.T, si int, m *Model)) {
	t.Helper()
	for si, spec := range specs {
		for _, ghost := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/ghost=%v", spec.Name, ghost), func(t *testing.T) {
				m, err := NewWithBackend(spec, Gonum{})
				if err != nil {
					t.Fatal(err)
				}
				f(t, si, withConvMode(m, ghost))
			})
		}
	}
}

// perExampleNorms returns each example's gradient norm, the slow way.
func perExampleNorms(t *testing.T, ws *Workspace, theta, x []float32, y []int32) []float64 {
	t.Helper()
	d := ws.m.InputSize()
	g := make([]float32, ws.m.NumParams())
	out := make([]float64, len(y))
	for i := range y {
		if _, err := ws.MeanGrad(g, theta, x[i*d:(i+1)*d], y[i:i+1]); err != nil {
			t.Fatal(err)
		}
		out[i] = math.Sqrt(sumSq(g))
	}
	return out
}

func relDiff(got, want []float32) float64 {
	var d2, w2 float64
	for i := range got {
		d := float64(got[i]) - float64(want[i])
		d2 += d * d
		w2 += float64(want[i]) * float64(want[i])
	}
	if w2 == 0 {
		return math.Sqrt(d2)
	}
	return math.Sqrt(d2 / w2)
}

// checkClipped compares ClippedSum with the naive reference on one batch
// drawn for the seed (checkClippedOn).
func checkClipped(t *testing.T, m *Model, B int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	theta := randomTheta(t, m, seed)
	x, y := randomBatch(m, B, rng)
	checkClippedOn(t, m, theta, x, y, B+rng.IntN(3))
}

// checkClippedOn compares ClippedSum with the naive reference on the batch,
// in a workspace for maxB ≥ len(y) examples, with the clip norm at the
// median per-example norm so that some examples are clipped and some are
// not.
func checkClippedOn(t *testing.T, m *Model, theta, x []float32, y []int32, maxB int) {
	t.Helper()
	B := len(y)
	ws, err := m.NewWorkspace(maxB)
	if err != nil {
		t.Fatal(err)
	}
	norms := perExampleNorms(t, ws, theta, x, y)
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	clip := sorted[len(sorted)/2]
	if clip == 0 {
		clip = 1
	}
	got := make([]float32, m.NumParams())
	want := make([]float32, m.NumParams())
	n, err := ws.ClippedSum(got, theta, x, y, clip)
	if err != nil {
		t.Fatal(err)
	}
	if n != B {
		t.Fatalf("count = %d, want %d", n, B)
	}
	// ClippedSum clips with a rigorous upper bound Nᵢ of each norm (see
	// ClippedSum), the naive reference with the float32 norm itself: they
	// differ by the bound's over-estimate, plus float32 rounding (1e-4).
	over := 0.0
	for i, n := range clipNorms(ws, B) {
		over = max(over, n/norms[i]-1)
	}
	if _, err := ws.ClippedSumNaive(want, theta, x, y, clip); err != nil {
		t.Fatal(err)
	}
	if rel := relDiff(got, want); !(rel <= 1e-4+over) {
		t.Fatalf("%s B=%d clip=%.4g norms=%.4g: clipped sum relative error %.3g (bound over-estimate %.3g)", m.spec.Name, B, clip, norms, rel, over)
	}
	// The result really is a clipped sum: its norm is at most B·clip, with
	// no tolerance (ClippedSum clips to C·(1−2⁻¹⁶) to absorb rounding).
	if s := math.Sqrt(sumSq(got)); s > float64(B)*clip {
		t.Fatalf("‖clipped sum‖ = %v > B·C = %v", s, float64(B)*clip)
	}
}

// TestClippedSumMatchesNaiveOnLayerCases runs the property check on every
// gradient case with both convolution norm strategies.
func TestClippedSumMatchesNaiveOnLayerCases(t *testing.T) {
	for ci, spec := range gradCases() {
		m, err := New(spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, ghost := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/ghost=%v", spec.Name, ghost), func(t *testing.T) {
				for _, B := range []int{1, 2, 7} {
					checkClipped(t, withConvMode(m, ghost), B, uint64(100*ci+B))
				}
			})
		}
	}
}

// randomSpec draws a random valid model: dense, convolutional or text.
func randomSpec(rng *rand.Rand) Spec {
	classes := 2 + rng.IntN(4)
	act := func() LayerSpec {
		return LayerSpec{Type: []string{ReLU, Tanh, LayerNorm}[rng.IntN(3)]}
	}
	for {
		var s Spec
		switch rng.IntN(3) {
		case 0:
			s = Spec{Name: "rand-dense", Input: []int{1 + rng.IntN(12)}, Classes: classes}
			for range rng.IntN(3) {
				s.Layers = append(s.Layers, LayerSpec{Type: Linear, Out: 1 + rng.IntN(10)}, act())
			}
			s.Layers = append(s.Layers, LayerSpec{Type: Linear, Out: classes})
		case 1:
			s = Spec{Name: "rand-conv", Input: []int{1 + rng.IntN(3), 3 + rng.IntN(7), 3 + rng.IntN(7)}, Classes: classes}
			for range 1 + rng.IntN(2) {
				k := 1 + rng.IntN(3)
				s.Layers = append(s.Layers, LayerSpec{Type: Conv2D, Out: 1 + rng.IntN(4), Kernel: k, Stride: 1 + rng.IntN(2), Pad: rng.IntN(k)})
				s.Layers = append(s.Layers, LayerSpec{Type: []string{ReLU, Tanh}[rng.IntN(2)]})
				if rng.IntN(2) == 0 {
					s.Layers = append(s.Layers, LayerSpec{Type: []string{MaxPool, AvgPool}[rng.IntN(2)], Kernel: 1 + rng.IntN(2), Stride: 1 + rng.IntN(2)})
				}
			}
			s.Layers = append(s.Layers, LayerSpec{Type: Flatten}, LayerSpec{Type: Linear, Out: classes})
		default:
			s = Spec{Name: "rand-text", Input: []int{1 + rng.IntN(6)}, Classes: classes, Layers: []LayerSpec{
				{Type: EmbeddingBag, Vocab: 2 + rng.IntN(9), Dim: 1 + rng.IntN(5)}}}
			if rng.IntN(2) == 0 {
				s.Layers = append(s.Layers, LayerSpec{Type: Linear, Out: 1 + rng.IntN(6)}, act())
			}
			s.Layers = append(s.Layers, LayerSpec{Type: Linear, Out: classes})
		}
		if s.Validate() == nil {
			return s
		}
	}
}

// TestClippedSumMatchesNaiveRandom is the property test over random
// architectures, shapes and batch sizes.
func TestClippedSumMatchesNaiveRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 3))
	for trial := range 60 {
		spec := randomSpec(rng)
		m, err := New(spec)
		if err != nil {
			t.Fatal(err)
		}
		B := 1 + rng.IntN(9)
		ghost := rng.IntN(2) == 0
		t.Run(fmt.Sprintf("%d-%s", trial, spec.Name), func(t *testing.T) {
			checkClipped(t, withConvMode(m, ghost), B, uint64(trial))
		})
	}
}

// TestClippedSumMatchesNaivePresets runs the property check on the presets.
func TestClippedSumMatchesNaivePresets(t *testing.T) {
	for i, name := range Presets() {
		spec, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "textbag" {
			spec = TextBag(50, 8, 8, 4, 16) // the shape, with a smaller table
		}
		m, err := New(spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) { checkClipped(t, m, 8, uint64(i)) })
	}
}

// TestClippedSumLargeClipIsBTimesMean: with a clip norm above every
// per-example norm nothing is clipped and the sum is B times the mean.
func TestClippedSumLargeClipIsBTimesMean(t *testing.T) {
	m, err := New(MLP([]int{20}, []int{16}, 4))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	theta := randomTheta(t, m, 5)
	x, y := randomBatch(m, 6, rng)
	ws, _ := m.NewWorkspace(6)
	sum := make([]float32, m.NumParams())
	mean := make([]float32, m.NumParams())
	if _, err := ws.ClippedSum(sum, theta, x, y, 1e9); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.MeanGrad(mean, theta, x, y); err != nil {
		t.Fatal(err)
	}
	for i := range mean {
		mean[i] *= 6
	}
	if rel := relDiff(sum, mean); rel > 1e-5 {
		t.Fatalf("unclipped sum vs 6·mean: relative error %.3g", rel)
	}
}

// TestClippedSumDeterministic: same inputs, same bits, whatever GOMAXPROCS.
func TestClippedSumDeterministic(t *testing.T) {
	spec, _ := Preset("cnn")
	m, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8, 8))
	theta := randomTheta(t, m, 8)
	x, y := randomBatch(m, 32, rng)
	run := func(procs int) []float32 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		ws, err := m.NewWorkspace(32)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float32, m.NumParams())
		if _, err := ws.ClippedSum(out, theta, x, y, 0.5); err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, b, c := run(1), run(2), run(4)
	if !slices.Equal(a, b) || !slices.Equal(a, c) {
		t.Fatal("clipped sum differs across GOMAXPROCS")
	}
}

func TestGradientErrors(t *testing.T) {
	m, err := New(TextBag(5, 3, 4, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	ws, _ := m.NewWorkspace(2)
	theta := randomTheta(t, m, 1)
	dst := make([]float32, m.NumParams())
	good := []float32{0, 1, -1, 4, 4, 2}
	nan := slices.Clone(theta)
	nan[0] = float32(math.NaN())
	tests := []struct {
		name  string
		dst   []float32
		theta []float32
		x     []float32
		y     []int32
		clip  float64
		want  error
	}{
		{"short theta", dst, theta[1:], good, []int32{0, 1}, 1, ErrShape},
		{"short dst", dst[1:], theta, good, []int32{0, 1}, 1, ErrShape},
		{"nil dst", nil, theta, good, []int32{0, 1}, 1, ErrShape},
		{"x length", dst, theta, good[1:], []int32{0, 1}, 1, ErrShape},
		{"batch too big", dst, theta, append(slices.Clone(good), 1, 2, 3), []int32{0, 1, 1}, 1, ErrShape},
		{"label", dst, theta, good, []int32{0, 2}, 1, ErrShape},
		{"negative label", dst, theta, good, []int32{-1, 0}, 1, ErrShape},
		{"token too big", dst, theta, []float32{0, 1, 5, 4, 4, 2}, []int32{0, 1}, 1, ErrShape},
		{"token fraction", dst, theta, []float32{0, 1.5, 2, 4, 4, 2}, []int32{0, 1}, 1, ErrShape},
		{"token nan", dst, theta, []float32{0, float32(math.NaN()), 2, 4, 4, 2}, []int32{0, 1}, 1, ErrShape},
		{"token -2", dst, theta, []float32{0, -2, 2, 4, 4, 2}, []int32{0, 1}, 1, ErrShape},
		{"zero clip", dst, theta, good, []int32{0, 1}, 0, ErrBadClip},
		{"nan clip", dst, theta, good, []int32{0, 1}, math.NaN(), ErrBadClip},
		{"inf clip", dst, theta, good, []int32{0, 1}, math.Inf(1), ErrBadClip},
		{"nan theta", dst, nan, []float32{0, 1, 2, 0, 1, 2}, []int32{0, 1}, 1, ErrNonFinite},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ws.ClippedSum(tc.dst, tc.theta, tc.x, tc.y, tc.clip)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ClippedSum error = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := ws.MeanGrad(dst, theta, nil, nil); !errors.Is(err, ErrShape) {
		t.Fatalf("MeanGrad on empty batch: %v, want ErrShape", err)
	}
	for i := range dst {
		dst[i] = 7
	}
	n, err := ws.ClippedSum(dst, theta, nil, nil, 1)
	if err != nil || n != 0 || slices.ContainsFunc(dst, func(v float32) bool { return v != 0 }) {
		t.Fatalf("empty batch: n=%d err=%v, dst not zeroed", n, err)
	}
}

func TestEvaluate(t *testing.T) {
	m, err := New(LogReg([]int{2}, 2))
	if err != nil {
		t.Fatal(err)
	}
	// logits = (x0, x1): predicts the larger coordinate.
	theta := []float32{1, 0, 0, 1, 0, 0}
	x := []float32{2, 0, 0, 2, 3, 1, 0, 1, 5, 4}
	y := []int32{0, 1, 1, 1, 0}
	ws, _ := m.NewWorkspace(2) // several batches
	got, err := ws.Evaluate(theta, x, y)
	if err != nil {
		t.Fatal(err)
	}
	var wantLoss float64
	for i := range y {
		z0, z1 := float64(x[2*i]), float64(x[2*i+1])
		lse := math.Log(math.Exp(z0) + math.Exp(z1))
		wantLoss += lse - []float64{z0, z1}[y[i]]
	}
	wantLoss /= 5
	if got.N != 5 || got.Accuracy != 0.8 || math.Abs(got.Loss-wantLoss) > 1e-6 {
		t.Fatalf("Evaluate = %+v, want N 5, accuracy 0.8, loss %v", got, wantLoss)
	}
}

// TestTanh32 bounds the float32 tanh against math.Tanh over a dense grid.
func TestTanh32(t *testing.T) {
	var worst float64
	for x := -12.0; x <= 12; x += 1e-4 {
		got := float64(tanh32(float32(x)))
		want := math.Tanh(float64(float32(x)))
		worst = math.Max(worst, math.Abs(got-want))
	}
	// A few float32 ulps of 1 (ulp = 6e-8).
	if worst > 5e-7 {
		t.Fatalf("max |tanh32 - tanh| = %.3g", worst)
	}
}

// TestClippedSumIndexed: chunked sums over dataset rows match one big
// ClippedSum, and bad indices are errors.
func TestClippedSumIndexed(t *testing.T) {
	m, err := New(MLP([]int{6}, []int{5}, 3))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(4, 4))
	x, y := randomBatch(m, 40, rng)
	d := &dataset.Dataset{Name: "t", X: x, Y: y, Dim: 6, Classes: 3}
	theta := randomTheta(t, m, 4)
	idx := []int{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 38, 39, 0, 11}
	small, _ := m.NewWorkspace(4) // six chunks
	big, _ := m.NewWorkspace(len(idx))
	got := make([]float32, m.NumParams())
	want := make([]float32, m.NumParams())
	n, err := small.ClippedSumIndexed(got, theta, d, idx, 0.3)
	if err != nil || n != len(idx) {
		t.Fatalf("n = %d, err = %v", n, err)
	}
	sub := d.Subset(idx)
	if _, err := big.ClippedSum(want, theta, sub.X, sub.Y, 0.3); err != nil {
		t.Fatal(err)
	}
	if rel := relDiff(got, want); rel > 1e-6 {
		t.Fatalf("chunked vs single: relative error %.3g", rel)
	}
	for _, bad := range [][]int{{0, 40}, {-1}} {
		if _, err := small.ClippedSumIndexed(got, theta, d, bad, 0.3); !errors.Is(err, ErrShape) {
			t.Fatalf("idx %v: %v", bad, err)
		}
	}
	if _, err := small.ClippedSumIndexed(got, theta, &dataset.Dataset{Dim: 5, Classes: 3}, nil, 0.3); !errors.Is(err, ErrShape) {
		t.Fatalf("wrong dataset: %v", err)
	}
}

// TestGELUAccuracy: the float32 GELU values are the correctly rounded
// float64 ones of the literal formulas 0.5·x·(1 + erf(x/√2)) and
// 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) within one float32 rounding
// (plus 1e-12 relative for the difference between the float64
// evaluations), on a dense grid of [−5, 12] (below −5 the literal forms
// lose their accuracy to the cancellation in 1 + erf, 1 + tanh that the
// implementation avoids); the derivatives agree with central differences
// of the float64 forms (h = 1e-5: truncation and rounding both below
// 1e-9); and the extreme float32 inputs give finite values (x or −0 at
// ±3e38) and zero derivative in the negative tail.
func TestGELUAccuracy(t *testing.T) {
	erfForm := func(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }
	tanhForm := func(x float64) float64 {
		return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	}
	for _, c := range []struct {
		typ   string
		ref   func(float64) float64
		deriv func(float64) float64
	}{{GELU, erfForm, geluDeriv}, {GELUTanh, tanhForm, geluTanhDeriv}} {
		a := &activation{kind: c.typ, shape: []int{1}, n: 1}
		p := &pass{B: 1, workers: 1}
		in, out, dout, din := make([]float32, 1), make([]float32, 1), []float32{1}, make([]float32, 1)
		var worst, worstD float64
		for x := -5.0; x <= 12; x += 1e-3 {
			in[0] = float32(x)
			xv := float64(in[0])
			a.forward(p, nil, in, out)
			want := c.ref(xv)
			tol := 0x1p-24*math.Abs(want)*(1+1e-6) + 1e-12*math.Abs(want) + 0x1p-149
			worst = max(worst, math.Abs(float64(out[0])-want)/tol)
			a.backward(p, nil, in, out, dout, din)
			const h = 1e-5
			fd := (c.ref(xv+h) - c.ref(xv-h)) / (2 * h)
			worstD = max(worstD, math.Abs(float64(din[0])-fd)/(1e-7*math.Max(1, math.Abs(fd))))
			if d := c.deriv(xv); math.Abs(d-fd) > 1e-8 {
				t.Fatalf("%s'(%v) = %v, central difference %v", c.typ, xv, d, fd)
			}
		}
		t.Logf("%s: worst error %.3g of one float32 rounding, derivative %.3g of 1e-7", c.typ, worst, worstD)
		if worst > 1 || worstD > 1 {
			t.Errorf("%s: worst error %.3g of one float32 rounding, derivative %.3g of 1e-7", c.typ, worst, worstD)
		}
		for _, x := range []float32{3e38, -3e38, -40, 40} {
			in[0] = x
			a.forward(p, nil, in, out)
			a.backward(p, nil, in, out, dout, din)
			wantY, wantD := x, float32(1)
			if x < 0 {
				wantY, wantD = 0, 0
			}
			if out[0] != wantY || din[0] != wantD {
				t.Errorf("%s(%v) = %v, derivative %v; want %v, %v", c.typ, x, out[0], din[0], wantY, wantD)
			}
		}
	}
}

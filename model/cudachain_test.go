package model

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Tests of the CUDA engine's plan (cudachain.go) that run without a GPU.

// nestedResidualSpec is a model the CPU runs and the GPU engine refuses:
// a residual block nested in another.
func nestedResidualSpec() Spec {
	return Spec{Name: "nested-residual", Input: []int{5}, Classes: 3, Layers: []LayerSpec{
		{Type: Embedding, Vocab: 7, Dim: 4},
		{Type: Residual, Layers: []LayerSpec{{Type: Residual, Layers: []LayerSpec{{Type: LayerNorm}, {Type: Linear, Out: 4}}}}},
		{Type: MeanPool}, {Type: Linear, Out: 3}}}
}

// cpuOnlyRefusals is what the CUDA engine's refusal of each of
// cpuOnlyCases says: the layer, that it runs on the CPU engines only, and
// why.
var cpuOnlyRefusals = map[string]string{
	"gelu":               "layer 1 (gelu) runs on the CPU engines only: the CUDA engine has no kernels for gelu",
	"gelu_tanh":          "layer 1 (gelu_tanh) runs on the CPU engines only: the CUDA engine has no kernels for gelu_tanh",
	"no_bias":            "layer 0 (linear) runs on the CPU engines only: the CUDA engine has no kernels for no_bias",
	"seq-no_bias":        "layer 1 (linear on a sequence) runs on the CPU engines only: the CUDA engine has no kernels for no_bias",
	"embedding-types":    "layer 0 (embedding) runs on the CPU engines only: the CUDA engine has no kernels for positions ≠ T, pos_offset, types",
	"embedding-one-type": "layer 0 (embedding) runs on the CPU engines only: the CUDA engine has no kernels for positions ≠ T, pos_offset, types",
	"attention-padding":  "layer 1 (residual): nested layer 1 (attention) runs on the CPU engines only: the CUDA engine has no kernels for mask padding",
	"firsttoken":         "layer 3 (firsttoken) runs on the CPU engines only: the CUDA engine has no kernels for firsttoken",
	"lasttoken":          "layer 2 (lasttoken) runs on the CPU engines only: the CUDA engine has no kernels for lasttoken",
}

// TestCUDASupports: the GPU engine's plan accepts every preset and every
// case of the CPU's gradient tests but the CPU-only ones, sequence models
// included; it refuses each CPU-only case, and a residual block nested in
// another (which the CPU runs), with ErrUnsupportedLayer naming the layer
// (and the block).
func TestCUDASupports(t *testing.T) {
	for _, s := range cpuOnlyCases() {
		m, err := New(s)
		if err != nil {
			t.Fatal(err)
		}
		want := cpuOnlyRefusals[s.Name]
		if err := cudaSupports(m); want == "" || !errors.Is(err, ErrUnsupportedLayer) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: cudaSupports: %v, want ErrUnsupportedLayer containing %q", s.Name, err, want)
		}
	}
	specs := engineCases()
	for _, name := range Presets() {
		s, _ := Preset(name)
		specs = append(specs, s)
	}
	for _, s := range specs {
		m, err := New(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := cudaSupports(m); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
	m, err := New(nestedResidualSpec())
	if err != nil {
		t.Fatalf("the CPU builds the spec: %v", err)
	}
	err = cudaSupports(m)
	if !errors.Is(err, ErrUnsupportedLayer) || !strings.Contains(err.Error(), "layer 1 (residual): nested layer 0 (residual)") {
		t.Fatalf("cudaSupports: %v, want ErrUnsupportedLayer naming layer 1 (residual): nested layer 0 (residual)", err)
	}
}

// TestCUDAChain: the engine's units for the small language model are
// its layers with each block between its edges and each linear layer at
// T positions as its 1×1 convolution, with the blocks' parameter offsets;
// a model without blocks keeps its layers, offsets and sizes.
func TestCUDAChain(t *testing.T) {
	m, err := New(TransformerLM(7, 5, 4, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	units, off, size, src := cudaChain(m)
	var kinds []string
	for _, u := range units {
		kinds = append(kinds, strings.TrimPrefix(fmt.Sprintf("%T", u), "*model."))
	}
	want := "seqEmbed cudaResStart seqLayerNorm conv attention conv cudaResAdd cudaResStart seqLayerNorm conv activation conv cudaResAdd seqLayerNorm conv"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("units %s, want %s", got, want)
	}
	r := m.layers[1].(*residual)
	if off[3] != m.layerOff[1]+r.off[1] || size[3] != r.size[1] || src[3] != (cudaSrc{1, 1}) {
		t.Fatalf("unit 3: offset %d size %d src %v, want %d %d {1 1}", off[3], size[3], src[3], m.layerOff[1]+r.off[1], r.size[1])
	}
	if units[1].(*cudaResStart).end != 6 || units[6].(*cudaResAdd).start != 1 {
		t.Fatalf("block edges %+v %+v", units[1], units[6])
	}
	total := 0
	for _, n := range size {
		total += n
	}
	if total != m.numParams {
		t.Fatalf("units hold %d parameters, the model %d", total, m.numParams)
	}
	cnn, _ := Preset("cnn")
	mc, _ := New(cnn)
	units, off, size, _ = cudaChain(mc)
	if len(units) != len(mc.layers) || !slices.Equal(off, mc.layerOff) || !slices.Equal(size, mc.layerSize) {
		t.Fatalf("cnn: %d units for %d layers, offsets %v sizes %v", len(units), len(mc.layers), off, size)
	}
	for l, u := range units {
		if u != cudaUnit(mc.layers[l]) {
			t.Fatalf("cnn: unit %d is not layer %d", l, l)
		}
	}
}

//go:build cuda

package model

import (
	"errors"
	"strings"
	"testing"
)

// cudaGradCases are the gradient cases the GPU engine has kernels for:
// gradCases without the sequence models, which it refuses
// (TestCUDARefusesSequenceLayers).
func cudaGradCases() []Spec {
	var out []Spec
	for _, s := range gradCases() {
		if m, err := New(s); err == nil && cudaSupports(m) == nil {
			out = append(out, s)
		}
	}
	return out
}

// TestCUDARefusesSequenceLayers: the GPU engine refuses the sequence
// models with ErrUnsupportedLayer, naming the first layer it has no
// kernels for.
func TestCUDARefusesSequenceLayers(t *testing.T) {
	d := cudaTestDevice(t)
	for _, spec := range []Spec{TransformerLM(7, 5, 4, 1, 2), TransformerClassifier(9, 6, 4, 1, 2, 3)} {
		m, err := New(spec)
		if err != nil {
			t.Fatal(err)
		}
		_, err = d.NewEngine(m, 4)
		if !errors.Is(err, ErrUnsupportedLayer) || !strings.Contains(err.Error(), "layer 0 (embedding)") {
			t.Fatalf("%s: NewEngine: %v, want ErrUnsupportedLayer naming layer 0 (embedding)", spec.Name, err)
		}
	}
}

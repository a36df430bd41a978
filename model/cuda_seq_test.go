//go:build cuda

package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gorgonia.org/cu"

	"github.com/dpcluster/dpcluster/dataset"
)

// The sequence layers on the GPU (cuda_seq.go). Written without a GPU:
// these tests had not run when they were committed.

// cudaGradCases are the gradient cases the GPU engine has kernels for:
// every case of gradCases, the sequence models included (the filter keeps
// out a case whose layers the engine lacks, which
// TestCUDARefusesNestedResidual covers).
func cudaGradCases() []Spec {
	var out []Spec
	for _, s := range gradCases() {
		if m, err := New(s); err == nil && cudaSupports(m) == nil {
			out = append(out, s)
		}
	}
	return out
}

// cudaSeqSpecs are the sequence models of cudaGradCases and, at the
// preset's scale, the "transformer" preset and the classifier of the same
// stack.
func cudaSeqSpecs(presets bool) []Spec {
	var out []Spec
	for _, s := range cudaGradCases() {
		if s.Layers[0].Type == Embedding {
			out = append(out, s)
		}
	}
	if presets {
		lm, _ := Preset("transformer")
		out = append(out, lm, TransformerClassifier(2048, 64, 128, 2, 4, 4))
	}
	return out
}

// TestCUDARefusesNestedResidual: the GPU engine refuses a residual block
// nested in another (the CPU runs it) with ErrUnsupportedLayer, naming the
// block and the nested layer.
func TestCUDARefusesNestedResidual(t *testing.T) {
	m, err := New(nestedResidualSpec())
	if err != nil {
		t.Fatalf("the CPU builds the spec: %v", err)
	}
	_, err = cudaTestDevice(t).NewEngine(m, 4)
	if !errors.Is(err, ErrUnsupportedLayer) || !strings.Contains(err.Error(), "layer 1 (residual): nested layer 0 (residual)") {
		t.Fatalf("NewEngine: %v, want ErrUnsupportedLayer naming layer 1 (residual): nested layer 0 (residual)", err)
	}
}

// TestCUDARefusesCPUOnlyLayers: NewEngine refuses, before it allocates
// anything on the device, every model with a layer or field only the CPU
// engines run (the gradient cases cpuOnlyCases, and the BERT- and
// GPT-2-shaped models), with ErrUnsupportedLayer naming the layer and
// saying it runs on the CPU engines only (the messages of
// cpuOnlyRefusals); the device still makes engines after.
func TestCUDARefusesCPUOnlyLayers(t *testing.T) {
	d := cudaTestDevice(t)
	specs := append(cpuOnlyCases(), bertLike(tinyBERT()), gpt2Like(tinyGPT2(), false))
	for _, s := range specs {
		m, err := New(s)
		if err != nil {
			t.Fatalf("%s: the CPU builds the spec: %v", s.Name, err)
		}
		want, ok := cpuOnlyRefusals[s.Name]
		if !ok {
			want = "runs on the CPU engines only"
		}
		if e, err := d.NewEngine(m, 4); !errors.Is(err, ErrUnsupportedLayer) || !strings.Contains(err.Error(), want) {
			if err == nil {
				e.Close()
			}
			t.Errorf("%s: NewEngine: %v, want ErrUnsupportedLayer containing %q", s.Name, err, want)
		}
	}
	m, err := New(TransformerClassifier(9, 6, 4, 1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.NewEngine(m, 4)
	if err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
	e.Close()
}

// cudaSeqTheta is randomTheta for the small models and, at the preset's
// scale, the model's own initialization: randomTheta's N(0, 0.3²) noise on
// 128-wide layers gives attention scores in the tens, a nearly one-hot
// softmax whose gradient Pₜᵤ(∂Pₜᵤ − m) cancels, so that the engines'
// different rounding of the products below would exceed the tests'
// tolerances for a reason that is not a bug (as for
// TestCUDAClippedSumLargeMatchesCPU's wide MLP).
func cudaSeqTheta(t *testing.T, m *Model, seed uint64) []float32 {
	t.Helper()
	if m.numParams <= 1e5 {
		return randomTheta(t, m, seed)
	}
	theta := make([]float32, m.numParams)
	if err := m.Init(theta, seed); err != nil {
		t.Fatal(err)
	}
	return theta
}

// cudaSeqBatch draws B examples for m with some padding: example 1 all
// padding, example 2 one token repeated (its gradient rows cancel or add
// up in one token row), the others random ids in [-1, vocab).
func cudaSeqBatch(m *Model, B int, rng *rand.Rand) ([]float32, []int32) {
	x, y := randomBatch(m, B, rng)
	d := m.InputSize()
	for i := 1; i < min(B, 3); i++ {
		for j := range d {
			x[i*d+j] = float32(i - 2) // -1 (padding), then 0 (one token)
		}
	}
	return x, y
}

// TestCUDASeqPassesMatchCPU: for each sequence model, every unit's output
// and input gradient after the GPU's forward and backward passes agrees
// with the CPU workspace's (top-level or inside its residual block) to
// 1e-4 relative, and the embedding's output has the CPU's bits; the first
// unit that differs is named, so a wrong kernel is found by its layer.
func TestCUDASeqPassesMatchCPU(t *testing.T) {
	for si, spec := range cudaSeqSpecs(true) {
		t.Run(spec.Name, func(t *testing.T) {
			m, err := NewWithBackend(spec, Gonum{})
			if err != nil {
				t.Fatal(err)
			}
			const B = 6
			rng := rand.New(rand.NewPCG(uint64(si), 21))
			theta := cudaSeqTheta(t, m, uint64(si)+21)
			x, y := cudaSeqBatch(m, B, rng)
			ws, _ := m.NewWorkspace(B)
			g := make([]float32, m.numParams)
			if _, err := ws.MeanGrad(g, theta, x, y); err != nil {
				t.Fatal(err)
			}
			e := newCUDAEngine(t, m, B)
			err = e.d.do(func() error {
				return errors.Join(e.begin(theta), e.load(x, y), e.forward(B), e.lossGrad(B, e.grad[len(e.ly)], 1/float32(B)), e.backward(B))
			})
			if err != nil {
				t.Fatal(err)
			}
			down := func(p cu.DevicePtr, n int) []float32 {
				v := make([]float32, n)
				if err := e.d.do(func() error { return dtoh(v, p) }); err != nil {
					t.Fatal(err)
				}
				return v
			}
			for u, ly := range e.ly {
				out, din := cpuUnitBufs(ws, e, u)
				n := B * shapeSize(ly.outShape())
				if out != nil {
					got, want := down(e.act[u+1], n), out[:n]
					if u == 0 && !slices.Equal(got, want) {
						t.Fatalf("unit 0 (%T): output not the CPU's bits", ly)
					}
					if r := relNorm(got, want); !(r <= 1e-4) {
						t.Fatalf("unit %d (%T): output ‖GPU − CPU‖/‖CPU‖ = %.3g", u, ly, r)
					}
				}
				if din != nil && e.needDin[u] {
					nin := len(din) / ws.maxB
					got, want := down(e.grad[u], B*nin), din[:B*nin]
					if r := relNorm(got, want); !(r <= 1e-4) {
						t.Fatalf("unit %d (%T): input gradient ‖GPU − CPU‖/‖CPU‖ = %.3g", u, ly, r)
					}
				}
			}
		})
	}
}

// cpuUnitBufs returns the CPU workspace's buffers that hold unit u's
// output and input gradient (nil where the CPU keeps none: a block's
// start edge's output is its input, and an input gradient the CPU does
// not need).
func cpuUnitBufs(ws *Workspace, e *cudaEngine, u int) (out, din []float32) {
	l, j := e.src[u].l, e.src[u].j
	switch e.ly[u].(type) {
	case *cudaResStart:
		return nil, ws.grad[l]
	case *cudaResAdd:
		rs := ws.states[l].(*resState)
		return ws.act[l+1], rs.grad[len(rs.r.layers)]
	}
	if j < 0 {
		return ws.act[l+1], ws.grad[l]
	}
	rs := ws.states[l].(*resState)
	return rs.act[j+1], rs.grad[j]
}

// TestCUDASeqClippedSum: for every sequence model, at the preset's scale
// too, and batches with padding and repeated tokens, the GPU's clipped
// sum agrees with the CPU engine's (1e-4 relative), its clip holds
// against the exact reference of its own stored values (cudaCheckClip),
// its clip factors agree with the CPU's (1e-3), its non-private gradient
// and evaluation agree with the CPU's, a chunked sum agrees with the CPU's
// single batch, and the same inputs give the same bits again and on a
// second engine.
func TestCUDASeqClippedSum(t *testing.T) {
	eachConvMode(t, cudaSeqSpecs(true), func(t *testing.T, si int, m *Model) {
		B := 13
		if m.numParams > 1e5 {
			B = 5 // the CPU oracle and the reference at the preset's scale
		}
		rng := rand.New(rand.NewPCG(uint64(si), 22))
		theta := cudaSeqTheta(t, m, uint64(si)+22)
		x, y := cudaSeqBatch(m, B, rng)
		ws, _ := m.NewWorkspace(B)
		e := newCUDAEngine(t, m, B)
		for _, clip := range []float64{1e-3, 1, 1e3} {
			want := make([]float32, m.numParams)
			if _, err := ws.ClippedSum(want, theta, x, y, clip); err != nil {
				t.Fatal(err)
			}
			got := cudaCheckClip(t, e, theta, x, y, clip)
			if r := relNorm(got, want); !(r <= 1e-4) {
				t.Fatalf("C = %g: ‖GPU − CPU‖/‖CPU‖ = %.3g", clip, r)
			}
			// As in TestCUDAClippedSumMatchesCPU: a ReLU input within
			// rounding of 0 may fall on the other side of the kink.
			off := 0
			for i := range y {
				if c, w := e.hcoef[i], ws.coef[i]; math.Abs(float64(c-w)) > 1e-3*float64(w)+1e-30 {
					off++
					t.Logf("C = %g: example %d: clip factor %v on the GPU, %v on the CPU", clip, i, c, w)
				}
			}
			if off > 1 {
				t.Fatalf("C = %g: %d of %d clip factors differ from the CPU's by more than 1e-3", clip, off, B)
			}
			again := make([]float32, m.numParams)
			if _, err := e.ClippedSum(again, theta, x, y, clip); err != nil || !slices.Equal(again, got) {
				t.Fatalf("C = %g: a second call gives other bits (err %v)", clip, err)
			}
		}
		other := make([]float32, m.numParams)
		first := make([]float32, m.numParams)
		if _, err := e.ClippedSum(first, theta, x, y, 0.1); err != nil {
			t.Fatal(err)
		}
		if _, err := newCUDAEngine(t, m, B).ClippedSum(other, theta, x, y, 0.1); err != nil || !slices.Equal(other, first) {
			t.Fatalf("a second engine gives other bits (err %v)", err)
		}
		cudaCheckMeanGradEvaluate(t, e, ws, theta, x, y, B, 0.05)
		// Chunks of 2 with the float64 accumulator carried, against
		// the CPU's single batch of the same rows.
		d := &dataset.Dataset{Name: "t", X: x, Y: y, Dim: m.InputSize(), Classes: m.Classes(), Vocab: m.vocab}
		idx := []int{3, 1, 0, 4, 2, 1}
		sub := d.Subset(idx)
		big, _ := m.NewWorkspace(len(idx))
		want := make([]float32, m.numParams)
		if _, err := big.ClippedSum(want, theta, sub.X, sub.Y, 0.3); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, m.numParams)
		if n, err := newCUDAEngine(t, m, 2).ClippedSumIndexed(got, theta, d, idx, 0.3); err != nil || n != len(idx) {
			t.Fatalf("chunked: n = %d, err = %v", n, err)
		}
		if r := relDiff(got, want); !(r <= 1e-5) {
			t.Fatalf("GPU chunked vs CPU single: relative error %.3g", r)
		}
	})
}

// TestCUDASeqClipAdversarial checks the GPU's clip on the sequence models
// against its exact reference on inputs chosen to break it: parameters so
// large (±1e18) that the passes overflow (an example whose gradient is not
// finite must add exactly zero and still be counted; the examples the GPU
// drops are the CPU's: the values are far from the overflow threshold),
// every token the same (the embedding's token rows add T positions), every
// example padding, and clip norms at both ends of the accepted range. No
// input alone makes one example overflow: the layer norm that starts every
// block normalizes its tokens' embeddings.
func TestCUDASeqClipAdversarial(t *testing.T) {
	for si, spec := range cudaSeqSpecs(false) {
		t.Run(spec.Name, func(t *testing.T) {
			m, err := NewWithBackend(spec, Gonum{})
			if err != nil {
				t.Fatal(err)
			}
			const B = 7
			e := newCUDAEngine(t, m, B)
			ws, _ := m.NewWorkspace(B)
			rng := rand.New(rand.NewPCG(uint64(si), 23))
			base := randomTheta(t, m, uint64(si)+23)
			x, y := cudaSeqBatch(m, B, rng)
			fill := func(n int, f func(j int) float32) []float32 {
				v := make([]float32, n)
				for j := range v {
					v[j] = f(j)
				}
				return v
			}
			huge := fill(m.numParams, func(j int) float32 { return 1e18 * float32(j%3-1) })
			same := fill(len(x), func(int) float32 { return 1 })
			pad := fill(len(x), func(int) float32 { return -1 })
			for _, c := range []struct {
				name  string
				theta []float32
				x     []float32
				clip  float64
			}{
				{"huge-theta", huge, x, 1}, {"same-token", base, same, 1e-2}, {"all-padding", base, pad, 1},
				{"tiny-clip", base, x, MinClipNorm}, {"huge-clip", base, x, MaxClipNorm},
			} {
				t.Run(c.name, func(t *testing.T) {
					cudaCheckClip(t, e, c.theta, c.x, y, c.clip)
					want := make([]float32, m.numParams)
					if _, err := ws.ClippedSum(want, c.theta, c.x, y, c.clip); err != nil {
						t.Fatal(err)
					}
					dropped := 0
					for i := range B {
						if (e.hcoef[i] == 0) != (ws.coef[i] == 0) {
							t.Fatalf("example %d: clip factor %v on the GPU, %v on the CPU", i, e.hcoef[i], ws.coef[i])
						}
						if e.hcoef[i] == 0 {
							dropped++
						}
					}
					t.Logf("%d of %d examples dropped", dropped, B)
				})
			}
		})
	}
}

// BenchmarkCUDATransformer: the "transformer" preset, B = 64 sequences of
// 64 tokens (BenchmarkTransformerStep's batch), without the CPU engine
// beside it (BenchmarkTransformerStep times that).
func BenchmarkCUDATransformer(b *testing.B) {
	spec, _ := Preset("transformer")
	benchCUDA(b, spec, 64, false)
}

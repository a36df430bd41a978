package model

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
)

// Internal layout. Activations are stored batch-major, one example after
// another, so per-example rescaling is a row operation. Image activations
// ([C, H, W] in the spec) are stored channels-last (H, W, C) so that a
// convolution over a whole batch is one GEMM on the unfolded input
// (rows = output positions); flatten converts back to C, H, W order, so the
// parameter semantics match PyTorch's.

// paramShape is one parameter tensor of a layer.
type paramShape struct {
	name  string
	shape []int
}

// pass carries what a kernel needs for one batch.
type pass struct {
	be      Backend
	B       int
	workers int
	// ids is the batch's model input as the first layer sees it (the
	// workspace's act[0]): for a model whose first layer is an embedding,
	// each example's T token ids (-1 = padding), which the layers that
	// look for padding read (attention with a padding mask, lasttoken;
	// plan checks that the model has them).
	ids []float32
	// coef holds the clip factors during ClippedSum's accGrad calls (the
	// output gradients are already scaled by them); nil otherwise.
	coef []float32
	// fresh and final tell accGrad where its sum goes (see put32): fresh,
	// the accumulator holds nothing yet (the first chunk of the call);
	// final, round the total into the float32 result (the last chunk).
	fresh, final bool
}

// par splits [0, n) into p.workers contiguous chunks (fewer for small n) and
// runs fn on each, the last chunk on the calling goroutine. Every index is
// handled by exactly one call, so results are deterministic as long as fn
// writes only to per-index outputs or per-worker scratch.
func (p *pass) par(n int, fn func(wk, lo, hi int)) {
	w := p.workers
	if w > n {
		w = n
	}
	if w <= 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + w - 1) / w
	for k := 0; k < w-1; k++ {
		lo, hi := k*chunk, min((k+1)*chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(k, lo, hi)
		}()
	}
	fn(w-1, (w-1)*chunk, n)
	wg.Wait()
}

// parFor is par, but runs serially when the total work is small.
func (p *pass) parFor(n, workPerItem int, fn func(wk, lo, hi int)) {
	if n*workPerItem < 1<<15 {
		fn(0, 0, n)
		return
	}
	p.par(n, fn)
}

// layer is one layer of a model: its shapes and parameters. It holds no
// buffers; newState gives its kernels over one workspace's.
type layer interface {
	outShape() []int
	paramShapes() []paramShape
	init(w []float32, rng *rand.Rand)
	// newState allocates per-workspace buffers for up to maxB examples
	// (workers: the goroutines a pass may use; needDin: whether backward
	// must write din) and returns the layer's kernels bound to them.
	// Layers that need no buffers return themselves.
	newState(maxB, workers int, needDin bool) layerState
}

// layerState is one layer's kernels with the buffers of one workspace,
// which they own (the typed state of each layer kind: linearState,
// convState, …). in/out/dout/din hold B examples each, in the internal
// layout; w (dw) is this layer's slice of theta (of the gradient).
// Parameter-free layers have no-op bound, paramGrad, accGrad and
// clearExample (noParams).
type layerState interface {
	forward(p *pass, w, in, out []float32)
	// backward writes din = ∂loss/∂in given dout; din is nil when not needed.
	backward(p *pass, w, in, out, dout, din []float32)
	// bound adds to b, for each example, the bounds of this layer's
	// parameters (see clipBounds and ClippedSum): an upper bound on the
	// squared norm of the exact per-example gradient implied by the stored
	// values, and the rounding error shares of accGrad's sum. It reads the
	// stored values only.
	bound(p *pass, in, out, dout []float32, b clipBounds)
	// paramGrad writes dw = alpha · Σ_i (example i's parameter gradient):
	// the fast reduction of the non-private mean gradient.
	paramGrad(p *pass, dw, in, out, dout []float32, alpha float32)
	// accGrad adds Σ_i (example i's parameter gradient) to the float64
	// accumulator acc, or, if p.final, writes acc plus that sum rounded to
	// float32 into dst (acc and dst: this layer's slices of the parameter
	// vector, public layout; see put32 for p.fresh), with a rounding error
	// within the shares bound charged: float32 products over blocks of at
	// most blockRows rows, added in float64, in an order that depends on
	// the row index only.
	accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32)
	// clearExample zeroes example i's stored values that accGrad reads, so
	// that the example adds exactly zero whatever they held (0·NaN would
	// not be zero).
	clearExample(i int, in, dout []float32)
}

// blockRows is the number of rows (examples × output positions) whose
// products ClippedSum sums in float32 before adding them into its float64
// accumulator. An example's share of the float32 summation error is then
// at most γ_{blockRows}(u32) ≈ 1.5e-5 of ρᵢ = Σₜ‖dₜ‖‖ãₜ‖ (a row's share of
// a block's error does not depend on which other rows share the block).
// 128 rows halved the share but cost the mlp preset 3–4% per step at
// B = 256 (two blocks and a float64 pass instead of one product written
// in place; BenchmarkMLPStep, paired).
const blockRows = 256

// put32 takes one partial sum src of a layer's clipped sum (a block's
// float32 product) for the elements acc and dst cover: first, acc holds
// nothing for them yet; last, src is the last part, so the total is
// rounded into dst rather than kept in acc:
//
//	first, last:   dst = src
//	first, !last:  acc = src
//	!first, last:  dst = fl32(acc + src)
//	!first, !last: acc += src
//
// Long vectors are split over goroutines; each element is one operation,
// so the result does not depend on the split.
func put32(p *pass, acc []float64, dst, src []float32, first, last bool) {
	p.parFor(len(src), 1, func(_, lo, hi int) {
		a, d, s := acc[lo:hi], dst[lo:hi], src[lo:hi]
		switch {
		case first && last:
			copy(d, s)
		case first:
			for j, v := range s {
				a[j] = float64(v)
			}
		case last:
			for j, v := range s {
				d[j] = float32(a[j] + float64(v))
			}
		default:
			for j, v := range s {
				a[j] += float64(v)
			}
		}
	})
}

// put64 is put32 for a float64 partial sum.
func put64(acc []float64, dst []float32, src []float64, first, last bool) {
	switch {
	case first && last:
		for j, v := range src {
			dst[j] = float32(v)
		}
	case first:
		copy(acc, src)
	case last:
		for j, v := range src {
			dst[j] = float32(acc[j] + v)
		}
	default:
		for j, v := range src {
			acc[j] += v
		}
	}
}

// unused reports the first of the named fields that is set, so a spec with
// a meaningless field is rejected rather than silently ignored.
func unused(ls LayerSpec, fields ...string) error {
	for _, f := range fields {
		set := false
		switch f {
		case "out":
			set = ls.Out != 0
		case "kernel":
			set = ls.Kernel != 0
		case "stride":
			set = ls.Stride != 0
		case "pad":
			set = ls.Pad != 0
		case "vocab":
			set = ls.Vocab != 0
		case "dim":
			set = ls.Dim != 0
		case "eps":
			set = ls.Eps != 0
		}
		if set {
			return fmt.Errorf("field %q is not used by %s", f, ls.Type)
		}
	}
	return nil
}

// ownedFields lists the fields that only one layer type uses, so
// buildLayer refuses them on every other type (fields shared by several
// types are checked by each constructor, with unused).
var ownedFields = []struct {
	name, typ string
	set       func(LayerSpec) bool
}{
	{"heads", Attention, func(ls LayerSpec) bool { return ls.Heads != 0 }},
	{"mask", Attention, func(ls LayerSpec) bool { return ls.Mask != "" }},
	{"layers", Residual, func(ls LayerSpec) bool { return ls.Layers != nil }},
	{"no_bias", Linear, func(ls LayerSpec) bool { return ls.NoBias }},
	{"lora", Linear, func(ls LayerSpec) bool { return ls.LoRA != nil }},
	{"positions", Embedding, func(ls LayerSpec) bool { return ls.Positions != 0 }},
	{"pos_offset", Embedding, func(ls LayerSpec) bool { return ls.PosOffset != 0 }},
	{"types", Embedding, func(ls LayerSpec) bool { return ls.Types != 0 }},
	{"type_sep", Embedding, func(ls LayerSpec) bool { return ls.TypeSep != nil }},
}

// buildLayer checks one (normalized) layer spec against its input shape;
// idx is its index in the model, -1 inside a residual block.
func buildLayer(idx int, ls LayerSpec, in []int) (layer, error) {
	for _, f := range ownedFields {
		if ls.Type != f.typ && f.set(ls) {
			return nil, fmt.Errorf("field %q is not used by %s", f.name, ls.Type)
		}
	}
	switch ls.Type {
	case Linear:
		if len(in) == 2 {
			return newSeqLinear(ls, in)
		}
		return newLinear(ls, in)
	case ReLU, Tanh, GELU, GELUTanh:
		return newActivation(ls, in)
	case Flatten:
		return newFlatten(ls, in)
	case Conv2D:
		return newConv(ls, in)
	case MaxPool, AvgPool:
		return newPool(ls, in)
	case EmbeddingBag:
		return newEmbedBag(idx, ls, in)
	case LayerNorm:
		if len(in) == 2 {
			return newSeqLayerNorm(ls, in)
		}
		return newLayerNorm(ls, in)
	case Embedding:
		return newSeqEmbed(idx, ls, in)
	case Attention:
		return newAttention(ls, in)
	case Residual:
		return newResidual(ls, in)
	case MeanPool:
		return newMeanPool(ls, in)
	case FirstToken, LastToken:
		return newTokenPick(ls, in)
	case "":
		return nil, errors.New("missing layer type")
	}
	return nil, fmt.Errorf("unknown layer type %q", ls.Type)
}

// noParams provides the parameter methods of parameter-free layers and
// their states.
type noParams struct{}

func (noParams) paramShapes() []paramShape                                            { return nil }
func (noParams) init([]float32, *rand.Rand)                                           {}
func (noParams) bound(*pass, []float32, []float32, []float32, clipBounds)             {}
func (noParams) paramGrad(*pass, []float32, []float32, []float32, []float32, float32) {}
func (noParams) accGrad(*pass, []float64, []float32, []float32, []float32, []float32) {}
func (noParams) clearExample(int, []float32, []float32)                               {}

// colSum writes dst[j] = Σ_r m[r, j] over rows r < rows of the row-major
// rows×cols matrix m, in float64, in row order.
func colSum(dst []float64, m []float32, rows, cols int) {
	clear(dst)
	for r := 0; r < rows; r++ {
		row := m[r*cols : (r+1)*cols]
		for j, v := range row {
			dst[j] += float64(v)
		}
	}
}

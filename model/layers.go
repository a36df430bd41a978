package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/dpcluster/dpcluster/dataset"
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

// layer is one layer's kernels. in/out/dout/din hold B examples each, in
// the internal layout; w (dw) is this layer's slice of theta (of the
// gradient). Parameter-free layers have no-op sqNorms and paramGrad.
type layer interface {
	outShape() []int
	paramShapes() []paramShape
	init(w []float32, rng *rand.Rand)
	// newState allocates per-workspace buffers for up to maxB examples.
	newState(maxB, workers int, needDin bool) any
	forward(p *pass, w, in, out []float32, st any)
	// backward writes din = ∂loss/∂in given dout; din is nil when not needed.
	backward(p *pass, w, in, out, dout, din []float32, st any)
	// bound adds to b, for each example, the bounds of this layer's
	// parameters (see clipBounds and ClippedSum): an upper bound on the
	// squared norm of the exact per-example gradient implied by the stored
	// values, and the rounding error shares of accGrad's sum. It reads the
	// stored values only.
	bound(p *pass, in, out, dout []float32, b clipBounds, st any)
	// paramGrad writes dw = alpha · Σ_i (example i's parameter gradient):
	// the fast reduction of the non-private mean gradient.
	paramGrad(p *pass, dw, in, out, dout []float32, alpha float32, st any)
	// accGrad adds Σ_i (example i's parameter gradient) to the float64
	// accumulator acc, or, if p.final, writes acc plus that sum rounded to
	// float32 into dst (acc and dst: this layer's slices of the parameter
	// vector, public layout; see put32 for p.fresh), with a rounding error
	// within the shares bound charged: float32 products over blocks of at
	// most blockRows rows, added in float64, in an order that depends on
	// the row index only.
	accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32, st any)
	// clearExample zeroes example i's stored values that accGrad reads, so
	// that the example adds exactly zero whatever they held (0·NaN would
	// not be zero).
	clearExample(i int, in, dout []float32, st any)
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

// buildLayer checks one (normalized) layer spec against its input shape.
func buildLayer(idx int, ls LayerSpec, in []int) (layer, error) {
	switch ls.Type {
	case Linear:
		if err := unused(ls, "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
			return nil, err
		}
		if len(in) != 1 {
			return nil, errors.New("linear needs a flat input; add a flatten layer before it")
		}
		if ls.Out < 1 || ls.Out > maxElems {
			return nil, fmt.Errorf("out = %d, need ≥ 1", ls.Out)
		}
		if shapeSize([]int{ls.Out, in[0]}) < 1 {
			return nil, errors.New("weight too large")
		}
		return &linear{in: in[0], out: ls.Out}, nil
	case ReLU, Tanh:
		if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
			return nil, err
		}
		return &activation{tanh: ls.Type == Tanh, shape: slices.Clone(in), n: shapeSize(in)}, nil
	case Flatten:
		if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
			return nil, err
		}
		f := &flatten{n: shapeSize(in), c: 1, hw: shapeSize(in)}
		if len(in) == 3 {
			f.c, f.hw = in[0], in[1]*in[2]
		}
		return f, nil
	case Conv2D:
		if err := unused(ls, "vocab", "dim", "eps"); err != nil {
			return nil, err
		}
		if len(in) != 3 {
			return nil, errors.New("conv2d needs a [C, H, W] input")
		}
		if ls.Out < 1 || ls.Kernel < 1 || ls.Stride < 1 || ls.Pad < 0 || ls.Pad >= ls.Kernel {
			return nil, fmt.Errorf("need out ≥ 1, kernel ≥ 1, stride ≥ 1, 0 ≤ pad < kernel (got out %d kernel %d stride %d pad %d)", ls.Out, ls.Kernel, ls.Stride, ls.Pad)
		}
		c, h, w := in[0], in[1], in[2]
		if h+2*ls.Pad < ls.Kernel || w+2*ls.Pad < ls.Kernel {
			return nil, fmt.Errorf("kernel %d larger than padded input %d×%d", ls.Kernel, h+2*ls.Pad, w+2*ls.Pad)
		}
		ho := (h+2*ls.Pad-ls.Kernel)/ls.Stride + 1
		wo := (w+2*ls.Pad-ls.Kernel)/ls.Stride + 1
		K := shapeSize([]int{c, ls.Kernel, ls.Kernel})
		if K < 1 || shapeSize([]int{ls.Out, K}) < 1 || shapeSize([]int{ho, wo, K}) < 1 {
			return nil, errors.New("layer too large")
		}
		cv := &conv{c: c, h: h, w: w, o: ls.Out, k: ls.Kernel, s: ls.Stride, p: ls.Pad, ho: ho, wo: wo, T: ho * wo, K: K}
		// Per-example norm strategy (Li et al. 2022, "Large Language Models
		// Can Be Strong Differentially Private Learners", §4; Bu et al. 2023,
		// "Differentially Private Optimization on Large Model at Small Cost",
		// "book-keeping"). Per example, the ghost norm costs ~T²(K+O) (two
		// T×T Gram matrices) and its share of the clipped sum's product
		// ~T·O·K; materializing costs ~T·O·K for the per-example gradient,
		// which the clipped sum then adds (~O·K). Pick the cheaper, unless
		// storing the B per-example gradients would take more than twice
		// the memory of the layer's unfolded input and output gradients.
		cv.ghost = cv.T*cv.T*(cv.K+cv.o) < cv.o*cv.K || cv.o*cv.K > 2*cv.T*(cv.K+cv.o)
		return cv, nil
	case MaxPool, AvgPool:
		if err := unused(ls, "out", "pad", "vocab", "dim", "eps"); err != nil {
			return nil, err
		}
		if len(in) != 3 {
			return nil, fmt.Errorf("%s needs a [C, H, W] input", ls.Type)
		}
		if ls.Kernel < 1 || ls.Stride < 1 || ls.Kernel > in[1] || ls.Kernel > in[2] {
			return nil, fmt.Errorf("need 1 ≤ kernel ≤ H, W and stride ≥ 1 (got kernel %d stride %d)", ls.Kernel, ls.Stride)
		}
		return &pool{max: ls.Type == MaxPool, c: in[0], h: in[1], w: in[2], k: ls.Kernel, s: ls.Stride,
			ho: (in[1]-ls.Kernel)/ls.Stride + 1, wo: (in[2]-ls.Kernel)/ls.Stride + 1}, nil
	case EmbeddingBag:
		if err := unused(ls, "out", "kernel", "stride", "pad", "eps"); err != nil {
			return nil, err
		}
		if idx != 0 {
			return nil, errors.New("embeddingbag must be the first layer (its input is token ids)")
		}
		if len(in) != 1 {
			return nil, errors.New("embeddingbag needs a [L] token input")
		}
		if ls.Vocab < 1 || ls.Vocab > dataset.MaxTokenID || ls.Dim < 1 || shapeSize([]int{ls.Vocab, ls.Dim}) < 1 {
			return nil, fmt.Errorf("need 1 ≤ vocab ≤ %d and dim ≥ 1 (got vocab %d dim %d)", dataset.MaxTokenID, ls.Vocab, ls.Dim)
		}
		return &embedBag{L: in[0], V: ls.Vocab, D: ls.Dim}, nil
	case LayerNorm:
		if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim"); err != nil {
			return nil, err
		}
		if len(in) != 1 {
			return nil, errors.New("layernorm needs a flat input; add a flatten layer before it")
		}
		if !validEps(ls.Eps) {
			return nil, fmt.Errorf("eps = %v, need 0 < eps < 1", ls.Eps)
		}
		return &layerNorm{f: in[0], eps: ls.Eps}, nil
	case "":
		return nil, errors.New("missing layer type")
	}
	return nil, fmt.Errorf("unknown layer type %q", ls.Type)
}

// noParams provides the parameter methods of parameter-free layers.
type noParams struct{}

func (noParams) paramShapes() []paramShape                                                 { return nil }
func (noParams) init([]float32, *rand.Rand)                                                {}
func (noParams) bound(*pass, []float32, []float32, []float32, clipBounds, any)             {}
func (noParams) paramGrad(*pass, []float32, []float32, []float32, []float32, float32, any) {}
func (noParams) accGrad(*pass, []float64, []float32, []float32, []float32, []float32, any) {}
func (noParams) clearExample(int, []float32, []float32, any)                               {}

// ---------------------------------------------------------------- linear

// linear is y = W x + b with W [out, in].
//
// Per-example gradient of example i is (δᵢ aᵢᵀ, δᵢ), so its squared norm is
// ‖δᵢ‖²(‖aᵢ‖² + 1) without materializing it (Goodfellow 2015, "Efficient
// per-example gradient computations"; Li et al. 2022, "ghost clipping").
type linear struct {
	in, out int
}

type linearState struct {
	bsum []float64
	blk  []float32 // accGrad's block product [out, in], allocated on first use
}

func (l *linear) outShape() []int { return []int{l.out} }
func (l *linear) paramShapes() []paramShape {
	return []paramShape{{"weight", []int{l.out, l.in}}, {"bias", []int{l.out}}}
}
func (l *linear) init(w []float32, rng *rand.Rand) {
	uniformInit(w, 1/math.Sqrt(float64(l.in)), rng)
}
func (l *linear) newState(maxB, workers int, needDin bool) any {
	return &linearState{bsum: make([]float64, l.out)}
}

func (l *linear) forward(p *pass, w, in, out []float32, st any) {
	W, b := w[:l.out*l.in], w[l.out*l.in:]
	p.be.Sgemm(false, true, p.B, l.out, l.in, 1, in, l.in, W, l.in, 0, out, l.out)
	for i := 0; i < p.B; i++ {
		row := out[i*l.out : (i+1)*l.out]
		for o, bv := range b {
			row[o] += bv
		}
	}
}

func (l *linear) backward(p *pass, w, in, out, dout, din []float32, st any) {
	if din == nil {
		return
	}
	p.be.Sgemm(false, false, p.B, l.in, l.out, 1, dout, l.out, w[:l.out*l.in], l.in, 0, din, l.in)
}

// bound: example i's gradient is dᵢ ãᵢᵀ with ãᵢ = (aᵢ, 1), so
// ‖Gᵢ‖ = ‖dᵢ‖·‖ãᵢ‖ exactly, computed from float64 sums of exact squares
// (relative error below boundSlack); it is also ρᵢ, so the shares are
// proportional to the norm itself. accGrad's error per example: scaling
// dᵢ by cᵢ in float32 (u32·cᵢρᵢ, plus eta32·√O·‖ãᵢ‖ from underflow), the
// block product (γ_{blockRows}(u32)·cᵢρᵢ(1+u32), plus eta32·√(O·K) for
// products that underflow), the float64 bias sum and accumulator
// (accGamma each).
func (l *linear) bound(p *pass, in, out, dout []float32, b clipBounds, st any) {
	O, K := l.out, l.in
	for i := 0; i < p.B; i++ {
		l.boundExample(b, i, sumSq(in[i*K:(i+1)*K]), sumSq(dout[i*O:(i+1)*O]))
	}
}

// boundExample adds example i's bounds from a2 = Σ aᵢ² and d2 = Σ dᵢ²,
// each summed in float64 (relative error within boundSlack): the one place
// the linear layer's bound formula lives, for the CPU and the GPU engine
// (whose accGrad has the same structure: float32 blocks of blockRows rows
// added in float64).
func (l *linear) boundExample(b clipBounds, i int, a2, d2 float64) {
	O, K := l.out, l.in
	up := boundSlack(K + O)
	gR := gamma(blockRows, u32)
	lam := u32 + (1+u32)*(gR+3*accGamma*(1+gR))
	sO, sOK := math.Sqrt(float64(O)), math.Sqrt(float64(O)*float64(K))
	a2++ // ãᵢ = (aᵢ, 1)
	g := math.Sqrt(d2*a2) * up
	b.sq[i] += g * g
	b.share[i] += lam * g
	b.floor[i] += eta32 * (sO*math.Sqrt(a2)*(1+gR) + sOK) * up
}

func (l *linear) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32, st any) {
	s := st.(*linearState)
	O, K := l.out, l.in
	nb := (p.B + blockRows - 1) / blockRows
	for j := range nb {
		e0 := j * blockRows
		rows := min(blockRows, p.B-e0)
		first, last := p.fresh && j == 0, p.final && j == nb-1
		if first && last { // one block: its product is the result
			p.be.Sgemm(true, false, O, K, rows, 1, dout[e0*O:], O, in[e0*K:], K, 0, dst[:O*K], K)
			continue
		}
		if s.blk == nil {
			s.blk = make([]float32, O*K)
		}
		p.be.Sgemm(true, false, O, K, rows, 1, dout[e0*O:], O, in[e0*K:], K, 0, s.blk, K)
		put32(p, acc[:O*K], dst[:O*K], s.blk, first, last)
	}
	colSum(s.bsum, dout, p.B, O)
	put64(acc[O*K:], dst[O*K:], s.bsum, p.fresh, p.final)
}

func (l *linear) clearExample(i int, in, dout []float32, st any) {
	clear(in[i*l.in : (i+1)*l.in])
	clear(dout[i*l.out : (i+1)*l.out])
}

func (l *linear) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32, st any) {
	s := st.(*linearState)
	p.be.Sgemm(true, false, l.out, l.in, p.B, alpha, dout, l.out, in, l.in, 0, dw[:l.out*l.in], l.in)
	colSum(s.bsum, dout, p.B, l.out)
	db := dw[l.out*l.in:]
	for o, v := range s.bsum {
		db[o] = float32(float64(alpha) * v)
	}
}

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

// ---------------------------------------------------------------- activations

// activation is ReLU or tanh, elementwise.
type activation struct {
	noParams
	tanh  bool
	shape []int
	n     int
}

func (a *activation) outShape() []int                              { return slices.Clone(a.shape) }
func (a *activation) newState(maxB, workers int, needDin bool) any { return nil }

func (a *activation) forward(p *pass, w, in, out []float32, st any) {
	p.parFor(p.B, a.n*8, func(_, lo, hi int) {
		x, y := in[lo*a.n:hi*a.n], out[lo*a.n:hi*a.n]
		if a.tanh {
			for j, v := range x {
				y[j] = tanh32(v)
			}
			return
		}
		for j, v := range x {
			y[j] = max(v, 0)
		}
	})
}

func (a *activation) backward(p *pass, w, in, out, dout, din []float32, st any) {
	if din == nil {
		return
	}
	p.parFor(p.B, a.n, func(_, lo, hi int) {
		y, dy, dx := out[lo*a.n:hi*a.n], dout[lo*a.n:hi*a.n], din[lo*a.n:hi*a.n]
		if a.tanh {
			for j, v := range y {
				dx[j] = dy[j] * (1 - v*v)
			}
			return
		}
		for j, v := range y {
			if v > 0 {
				dx[j] = dy[j]
			} else {
				dx[j] = 0
			}
		}
	})
}

// ---------------------------------------------------------------- flatten

// flatten turns the internal (H, W, C) layout into C, H, W order.
type flatten struct {
	noParams
	n, c, hw int
}

func (f *flatten) outShape() []int                              { return []int{f.n} }
func (f *flatten) newState(maxB, workers int, needDin bool) any { return nil }

func (f *flatten) forward(p *pass, w, in, out []float32, st any) {
	if f.c == 1 {
		copy(out[:p.B*f.n], in[:p.B*f.n])
		return
	}
	for i := 0; i < p.B; i++ {
		x, y := in[i*f.n:(i+1)*f.n], out[i*f.n:(i+1)*f.n]
		for s := 0; s < f.hw; s++ {
			for c := 0; c < f.c; c++ {
				y[c*f.hw+s] = x[s*f.c+c]
			}
		}
	}
}

func (f *flatten) backward(p *pass, w, in, out, dout, din []float32, st any) {
	if din == nil {
		return
	}
	if f.c == 1 {
		copy(din[:p.B*f.n], dout[:p.B*f.n])
		return
	}
	for i := 0; i < p.B; i++ {
		dy, dx := dout[i*f.n:(i+1)*f.n], din[i*f.n:(i+1)*f.n]
		for s := 0; s < f.hw; s++ {
			for c := 0; c < f.c; c++ {
				dx[s*f.c+c] = dy[c*f.hw+s]
			}
		}
	}
}

// ---------------------------------------------------------------- conv2d

// conv is a 2-D convolution, computed as a GEMM on the unfolded input
// (im2col): cols [B·T, K] with T = Ho·Wo output positions and K = k·k·C,
// out [B·T, O] = cols · Wᵀ + b. The parameter W is [O, C, kh, kw]
// (PyTorch's order); internally it is permuted to [O, kh, kw, C] so that
// unfolding a channels-last input copies contiguous runs.
//
// Example i's weight gradient is Gᵢ = Dᵢᵀ Aᵢ with Dᵢ [T, O] its output
// gradients and Aᵢ [T, K] its unfolded input, so
// ‖Gᵢ‖² = Σ_{t,s} (Aᵢ Aᵢᵀ)_{ts} (Dᵢ Dᵢᵀ)_{ts} (ghost norm, Li et al. 2022
// §4.1, cost ~T²(K+O)) or directly ‖Dᵢᵀ Aᵢ‖² (materialized, cost ~T·O·K);
// ghost selects the first.
type conv struct {
	c, h, w, o, k, s, p, ho, wo int
	T, K                        int
	ghost                       bool
}

type convState struct {
	cols, dcols []float32
	wp          []float32 // weights (then weight gradient) in [O, kh, kw, C] order
	part        [gradChunks][]float32
	part64      [gradChunks][]float64 // accGrad's per-chunk sums, [O·K]
	pub64       []float64             // accGrad's sum in public order, [O·K]
	scratch     [][]float32           // per worker: [T·T]·2 (ghost only)
	bsum        [][]float64           // per worker [O]
	rowNorms    [][]float64           // per worker: αₜ then βₜ, [2T]
	piece       [][]float32           // per worker, materializing with T > normRows: [O·K]
	piece64     [][]float64           // per worker, likewise: [O·K]
	// gi holds, when materializing, each example's weight gradient
	// fl(Dᵢᵀ Aᵢ) [B, O·K] from bound, which accGrad sums; allocated on
	// first use.
	gi []float32
}

func (l *conv) outShape() []int { return []int{l.o, l.ho, l.wo} }
func (l *conv) paramShapes() []paramShape {
	return []paramShape{{"weight", []int{l.o, l.c, l.k, l.k}}, {"bias", []int{l.o}}}
}
func (l *conv) init(w []float32, rng *rand.Rand) {
	uniformInit(w, 1/math.Sqrt(float64(l.K)), rng)
}
func (l *conv) newState(maxB, workers int, needDin bool) any {
	st := &convState{cols: make([]float32, maxB*l.T*l.K), wp: make([]float32, l.o*l.K)}
	for c := range st.part {
		st.part[c] = make([]float32, l.o*l.K)
		st.part64[c] = make([]float64, l.o*l.K)
	}
	st.pub64 = make([]float64, l.o*l.K)
	if needDin {
		st.dcols = make([]float32, maxB*l.T*l.K)
	}
	for range workers {
		if l.ghost {
			st.scratch = append(st.scratch, make([]float32, 2*l.T*l.T))
		}
		st.bsum = append(st.bsum, make([]float64, l.o))
		st.rowNorms = append(st.rowNorms, make([]float64, 2*l.T))
		if !l.ghost && l.T > normRows {
			st.piece = append(st.piece, make([]float32, l.o*l.K))
			st.piece64 = append(st.piece64, make([]float64, l.o*l.K))
		}
	}
	return st
}

// permute copies the weights from the public [O, C, kh, kw] order to the
// internal [O, kh, kw, C] order (inverse: unpermute), matching the
// channels-last unfolded input whose patch rows are then contiguous runs.
func (l *conv) permute(dst, w []float32) {
	kk := l.k * l.k
	for o := 0; o < l.o; o++ {
		src, d := w[o*l.K:(o+1)*l.K], dst[o*l.K:(o+1)*l.K]
		for c := 0; c < l.c; c++ {
			for r := 0; r < kk; r++ {
				d[r*l.c+c] = src[c*kk+r]
			}
		}
	}
}

func (l *conv) unpermute(dst, w []float32) { unpermute(l, dst, w) }

// unpermute64 is unpermute for float64 values.
func (l *conv) unpermute64(dst, w []float64) { unpermute(l, dst, w) }

func unpermute[F float32 | float64](l *conv, dst, w []F) {
	kk := l.k * l.k
	for o := 0; o < l.o; o++ {
		src, d := w[o*l.K:(o+1)*l.K], dst[o*l.K:(o+1)*l.K]
		for c := 0; c < l.c; c++ {
			for r := 0; r < kk; r++ {
				d[c*kk+r] = src[r*l.c+c]
			}
		}
	}
}

// span returns, for an output column ow, the first input column of the
// window and the range [lo, hi) of kernel columns that fall inside the image.
func (l *conv) span(ow int) (w0, lo, hi int) {
	w0 = ow*l.s - l.p
	return w0, max(0, -w0), min(l.k, l.w-w0)
}

// im2col unfolds one example (H, W, C layout) into cols [T, K], patch
// order (kh, kw, c), zero outside the image.
func (l *conv) im2col(cols, x []float32) {
	kc := l.k * l.c
	r := 0
	for oh := 0; oh < l.ho; oh++ {
		for ow := 0; ow < l.wo; ow++ {
			w0, lo, hi := l.span(ow)
			for kh := 0; kh < l.k; kh++ {
				row := cols[r : r+kc]
				r += kc
				hh := oh*l.s - l.p + kh
				if hh < 0 || hh >= l.h || lo >= hi {
					clear(row)
					continue
				}
				clear(row[:lo*l.c])
				base := (hh*l.w + w0) * l.c
				copy(row[lo*l.c:hi*l.c], x[base+lo*l.c:base+hi*l.c])
				clear(row[hi*l.c:])
			}
		}
	}
}

// col2im is the adjoint of im2col: it accumulates cols into dx.
func (l *conv) col2im(dx, cols []float32) {
	clear(dx)
	kc := l.k * l.c
	r := 0
	for oh := 0; oh < l.ho; oh++ {
		for ow := 0; ow < l.wo; ow++ {
			w0, lo, hi := l.span(ow)
			for kh := 0; kh < l.k; kh++ {
				row := cols[r : r+kc]
				r += kc
				hh := oh*l.s - l.p + kh
				if hh < 0 || hh >= l.h || lo >= hi {
					continue
				}
				base := (hh*l.w + w0) * l.c
				d := dx[base+lo*l.c : base+hi*l.c]
				for j, v := range row[lo*l.c : hi*l.c] {
					d[j] += v
				}
			}
		}
	}
}

func (l *conv) forward(p *pass, w, in, out []float32, st any) {
	s := st.(*convState)
	nin, tk := l.h*l.w*l.c, l.T*l.K
	p.parFor(p.B, tk, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			l.im2col(s.cols[i*tk:(i+1)*tk], in[i*nin:(i+1)*nin])
		}
	})
	l.permute(s.wp, w[:l.o*l.K])
	b := w[l.o*l.K:]
	rows := p.B * l.T
	p.be.Sgemm(false, true, rows, l.o, l.K, 1, s.cols, l.K, s.wp, l.K, 0, out, l.o)
	for r := 0; r < rows; r++ {
		row := out[r*l.o : (r+1)*l.o]
		for o, bv := range b {
			row[o] += bv
		}
	}
}

// backward uses the permuted weights forward left in the state.
func (l *conv) backward(p *pass, w, in, out, dout, din []float32, st any) {
	if din == nil {
		return
	}
	s := st.(*convState)
	p.be.Sgemm(false, false, p.B*l.T, l.K, l.o, 1, dout, l.o, s.wp, l.K, 0, s.dcols, l.K)
	nin, tk := l.h*l.w*l.c, l.T*l.K
	p.parFor(p.B, tk, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			l.col2im(din[i*nin:(i+1)*nin], s.dcols[i*tk:(i+1)*tk])
		}
	})
}

// bound: example i's gradient is Gᵢ = Dᵢᵀ Ãᵢ (weights and bias, Ãᵢ = [Aᵢ 1]),
// with rows dₜ of Dᵢ (‖dₜ‖ = βₜ) and aₜ of Aᵢ (‖aₜ‖ = αₜ, ‖ãₜ‖ = √(αₜ²+1)),
// and ρᵢ = Σₜ βₜ‖ãₜ‖ ≥ ‖Gᵢ‖. With the ghost norm, the float32 Gram
// matrices Ĝa ≈ AᵢAᵢᵀ and Ĝd ≈ DᵢDᵢᵀ carry entrywise errors of at most
// γ_K(u32)·αₜαₛ and γ_O(u32)·βₜβₛ (plus K·eta32 and O·eta32 from
// underflow), and the float64 sum of their products a relative
// φ = γ_{T²}(u64). Writing ĜaĜd − GaGd = (Ĝa−Ga)Ĝd + Ga(Ĝd−Gd), with
// |Ga| ≤ |Ĝa| + γ_K·αₜαₛ, the computed n̂ (bias included) satisfies
//
//	|n̂ − ‖Gᵢ‖²| ≤ γ_K·αᵀ|Ĝd|α + γ_O·βᵀ|Ĝa|β + φ·Σ|ĜaĜd|
//	             + (γ_Kγ_O + 4φ)·ρᵢ² + 2·eta32·(K·Σ|Ĝd| + O·Σ|Ĝa|) + …
//
// (4φρᵢ² covers the float64 bias), evaluated from the Gram matrices in
// O(T²) per example, without branches; in the worst case it is κ·ρᵢ² with
// κ = γ_K + γ_O + γ_Kγ_O + 5φ. The bound is max(n̂, 0) plus this error;
// an n̂ below minus the error cannot happen in this arithmetic and makes
// the bound NaN (the example is dropped). accGrad's shares are then those
// of linear, with ρᵢ summed over positions (blocks of blockRows rows).
//
// When materializing, Ĝᵢ = Dᵢᵀ Aᵢ is formed by float32 products over pieces
// of at most R = normRows rows, added in float64 and rounded to float32
// once, so
//
//	‖Ĝᵢ − Dᵢᵀ Aᵢ‖ ≤ (γ_R(u32) + φ)(1+2u32)·ρᵢ + u32·‖Ĝᵢ‖ + eta32·√(O·K)·(T+1).
//
// The bound takes ‖Ĝᵢ‖ (and the float64 bias) as the norm and charges the
// distance to Gᵢ as a share: accGrad adds the stored cᵢ·Ĝᵢ (exact float64
// products), so example i's realized term is within cᵢ·share of cᵢGᵢ and
// its norm within cᵢ·N.
//
// Relative bound: the clip norm exceeds ‖Gᵢ‖ by at most a relative
// κ·(ρᵢ/‖Gᵢ‖)²/2 + γ_{blockRows}·ρᵢ/‖Gᵢ‖ (ghost, worst case) or
// γ_R·ρᵢ/‖Gᵢ‖ + 1e-6 (materialized): 3e-5 or less on typical examples of the
// cnn preset, where ρᵢ/‖Gᵢ‖ is about 5 to 10. Only cancellation across
// positions (ρᵢ ≫ ‖Gᵢ‖) over-clips noticeably, which is safe.
func (l *conv) bound(p *pass, in, out, dout []float32, b clipBounds, st any) {
	s := st.(*convState)
	T, K, O := l.T, l.K, l.o
	k := l.boundConsts()
	if !l.ghost && s.gi == nil {
		s.gi = make([]float32, len(s.cols)/K*O/T*K)
	}
	p.par(p.B, func(wk, lo, hi int) {
		bs := s.bsum[wk]
		al, be := s.rowNorms[wk][:T], s.rowNorms[wk][T:]
		for i := lo; i < hi; i++ {
			D := dout[i*T*O : (i+1)*T*O]
			A := s.cols[i*T*K : (i+1)*T*K]
			// ρ̃ = Σₜ βₜ‖ãₜ‖ (≥ ρ = Σₜ βₜαₜ), and Σ‖ãₜ‖, Σβₜ.
			var st convStats
			for t := 0; t < T; t++ {
				a2 := sumSq(A[t*K : (t+1)*K])
				al[t] = math.Sqrt(a2) * k.up
				be[t] = math.Sqrt(sumSq(D[t*O:(t+1)*O])) * k.up
				at := math.Sqrt(a2 + 1)
				st.rho += be[t] * at
				st.sat += at
				st.sb += be[t]
			}
			colSum(bs, D, T, O)
			for _, v := range bs {
				st.n += v * v
			}
			if l.ghost {
				ga, gd := s.scratch[wk][:T*T], s.scratch[wk][T*T:]
				p.be.Sgemm(false, true, T, T, K, 1, A, K, A, K, 0, ga, T)
				p.be.Sgemm(false, true, T, T, O, 1, D, O, D, O, 0, gd, T)
				// n̂ and, from the same entries, the terms of its error.
				for t := 0; t < T; t++ {
					at, bt := al[t], be[t]
					for u, av := range ga[t*T : (t+1)*T] {
						a, d := float64(av), float64(gd[t*T+u])
						ad := a * d
						st.n += ad
						st.eP += math.Abs(ad)
						st.eK += at * al[u] * math.Abs(d)
						st.eO += math.Abs(a) * bt * be[u]
						st.sa += math.Abs(a)
						st.sd += math.Abs(d)
					}
				}
			} else {
				gi := s.gi[i*O*K : (i+1)*O*K]
				l.product(p, s, gi, D, A, wk)
				st.n += sumSq(gi)
			}
			l.boundExample(b, i, &k, &st)
		}
	})
}

// convStats are the sums of one example that conv's bound formula takes,
// each accumulated in float64 in any order (boundSlack covers it), from
// αₜ = √(Σ aₜ²)·up and βₜ = √(Σ dₜ²)·up (up = convConsts.up):
//
//	rho = Σₜ βₜ√(αₜ²+1) (with αₜ before up), sat = Σₜ √(αₜ²+1), sb = Σₜ βₜ
//	n   = Σₒ(Σₜ dₜₒ)² (the bias) + n̂ (ghost: Σ ĜaĜd) or ‖Ĝᵢ‖² (materialized)
//	eK  = Σₜᵤ αₜαᵤ|Ĝd|, eO = Σₜᵤ |Ĝa|βₜβᵤ, eP = Σₜᵤ |ĜaĜd|,
//	sa  = Σ|Ĝa|, sd = Σ|Ĝd|   (ghost only)
//
// The CPU's bound computes them, and so do the GPU engine's kernels.
type convStats struct {
	rho, sat, sb, n    float64
	eK, eO, eP, sa, sd float64
}

// convConsts are the constants of conv's bound formula for the layer's shape.
type convConsts struct {
	up, phi, gK, gO, gM, gR, lam float64
	fK, fO, fT, sO, sOK, sOKT    float64
}

func (l *conv) boundConsts() convConsts {
	T, K, O := l.T, l.K, l.o
	gR := gamma(blockRows, u32)
	k := convConsts{
		up:  boundSlack(T*T + T + K + O),
		phi: gamma(T*T+T+K+O+16, u64),
		gK:  gamma(K, u32), gO: gamma(O, u32),
		gM:  gamma(l.pieceRows(), u32),
		gR:  gR,
		lam: u32 + (1+u32)*(gR+3*accGamma*(1+gR)),
		fK:  float64(K), fO: float64(O), fT: float64(T),
	}
	k.sO, k.sOK = math.Sqrt(k.fO), math.Sqrt(k.fO*k.fK)
	k.sOKT = k.sOK * k.fT
	return k
}

// boundExample adds example i's bounds from its sums s: the one place the
// convolution's bound formula (see bound) lives, for the CPU and the GPU
// engine.
func (l *conv) boundExample(b clipBounds, i int, k *convConsts, s *convStats) {
	up := k.up
	rho, sat, sb, n := s.rho*up, s.sat*up, s.sb*up, s.n
	var sq float64
	if l.ghost {
		err := (k.gK*s.eK+k.gO*s.eO+k.phi*s.eP)*up + (k.gK*k.gO+4*k.phi)*rho*rho +
			2*eta32*(k.fK*s.sd+k.fO*s.sa+k.fK*k.fO*k.fT*k.fT*eta32)*up
		if n < -err {
			sq = math.NaN()
		} else {
			sq = (max(n, 0) + err) * up
		}
		b.share[i] += k.lam * rho
		b.floor[i] += eta32 * (k.sO*sat*(1+k.gR) + k.sOKT) * up
	} else {
		g := math.Sqrt(n) * (1 + 2*u32) * up
		sq = g * g
		// The product's distance to the exact gradient; then two
		// float64 sums of exact products (weights) and the
		// float32 scaling of D and two float64 sums (bias).
		e := ((k.gM+k.phi)*(1+2*u32)*rho + eta32*(k.sOKT+k.sOK)) * up
		b.share[i] += e + 2*accGamma*(g+e) + (u32+2*accGamma*(1+u32))*sb
		b.floor[i] += eta32 * k.sO * k.fT * (1 + 2*accGamma) * up
	}
	b.sq[i] += sq
}

// normRows bounds the rows of one float32 product when materializing an
// example's weight gradient: pieces of at most normRows output positions
// are added in float64, so the product's error is γ_{normRows}(u32)·ρᵢ
// rather than γ_T(u32)·ρᵢ.
const normRows = 64

// pieceRows returns the rows of each piece of a materialized product:
// T split evenly into ⌈T/normRows⌉ pieces.
func (l *conv) pieceRows() int {
	n := (l.T + normRows - 1) / normRows
	return (l.T + n - 1) / n
}

// product writes example i's weight gradient Dᵀ A [O, K] (internal order)
// into dst: one float32 product if T ≤ normRows, else pieces of pieceRows
// rows added in float64 (worker wk's buffers) and rounded once.
func (l *conv) product(p *pass, s *convState, dst, D, A []float32, wk int) {
	T, K := l.T, l.K
	if T <= normRows {
		l.sgemmTN(p, dst, D, A, T)
		return
	}
	piece, acc := s.piece[wk], s.piece64[wk]
	clear(acc)
	R := l.pieceRows()
	for t0 := 0; t0 < T; t0 += R {
		rows := min(R, T-t0)
		l.sgemmTN(p, piece, D[t0*l.o:], A[t0*K:], rows)
		for j, v := range piece {
			acc[j] += float64(v)
		}
	}
	for j, v := range acc {
		dst[j] = float32(v)
	}
}

// productCols bounds the columns of one per-example product. These
// products already run on the workers p.par spreads the examples over; the
// pure-Go back end would split a wider one over goroutines again (from
// four 64×64 blocks of the result), which allocates per example and gains
// nothing. Each result element is summed in the same order either way.
const productCols = 64

// sgemmTN writes Dᵀ A [O, K] over the first rows rows of D [·, O] and
// A [·, K] into dst, in column pieces of at most productCols.
func (l *conv) sgemmTN(p *pass, dst, D, A []float32, rows int) {
	O, K := l.o, l.K
	for k0 := 0; k0 < K; k0 += productCols {
		n := min(productCols, K-k0)
		p.be.Sgemm(true, false, O, n, rows, 1, D, O, A[k0:], K, 0, dst[k0:], K)
	}
}

// accGrad sums blocks of blockRows rows (output positions of consecutive
// examples) with one float32 product each; block j goes to chunk
// j mod gradChunks, each chunk adds its blocks in order into its own
// float64 sum, and the chunks are added in order: the result depends on
// neither GOMAXPROCS nor the batch size beyond the last block.
func (l *conv) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32, st any) {
	s := st.(*convState)
	T, K, O := l.T, l.K, l.o
	bs := s.bsum[0]
	colSum(bs, dout, p.B*T, O)
	put64(acc[O*K:], dst[O*K:], bs, p.fresh, p.final)
	sum, pub := s.part64[0], s.pub64
	if !l.ghost {
		// Σᵢ cᵢ·Ĝᵢ over the stored per-example products, in example
		// order for every element (clearExample zeroed a dropped
		// example's Ĝᵢ, which may have held NaN).
		OK := O * K
		p.parFor(OK, p.B, func(_, lo, hi int) {
			acc := sum[lo:hi]
			clear(acc)
			for i, c := range p.coef[:p.B] {
				cf := float64(c)
				for j, v := range s.gi[i*OK+lo : i*OK+hi] {
					acc[j] += cf * float64(v)
				}
			}
		})
		l.unpermute64(pub, sum)
		put64(acc[:OK], dst[:OK], pub, p.fresh, p.final)
		return
	}
	R := p.B * T
	nb := (R + blockRows - 1) / blockRows
	p.par(gradChunks, func(_, lo, hi int) {
		for c := lo; c < hi; c++ {
			part, sum := s.part[c], s.part64[c]
			clear(sum)
			for j := c; j < nb; j += gradChunks {
				r0 := j * blockRows
				rows := min(blockRows, R-r0)
				p.be.Sgemm(true, false, O, K, rows, 1, dout[r0*O:], O, s.cols[r0*K:], K, 0, part, K)
				for k, v := range part {
					sum[k] += float64(v)
				}
			}
		}
	})
	for _, part := range s.part64[1:] {
		for k, v := range part {
			sum[k] += v
		}
	}
	l.unpermute64(pub, sum)
	put64(acc[:O*K], dst[:O*K], pub, p.fresh, p.final)
}

func (l *conv) clearExample(i int, in, dout []float32, st any) {
	s := st.(*convState)
	clear(s.cols[i*l.T*l.K : (i+1)*l.T*l.K])
	clear(dout[i*l.T*l.o : (i+1)*l.T*l.o])
	if s.gi != nil {
		clear(s.gi[i*l.o*l.K : (i+1)*l.o*l.K])
	}
}

// gradChunks is the fixed number of partial products a convolution's
// weight gradient is split into (by examples), so that the long reduction
// over B·T rows runs on several cores; partial results are summed in chunk
// order, so the result does not depend on the number of workers.
const gradChunks = 4

func (l *conv) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32, st any) {
	s := st.(*convState)
	p.par(gradChunks, func(_, lo, hi int) {
		for c := lo; c < hi; c++ {
			e0, e1 := c*p.B/gradChunks, (c+1)*p.B/gradChunks
			r0, rows := e0*l.T, (e1-e0)*l.T
			p.be.Sgemm(true, false, l.o, l.K, rows, alpha, dout[r0*l.o:], l.o, s.cols[r0*l.K:], l.K, 0, s.part[c], l.K)
		}
	})
	copy(s.wp, s.part[0])
	for _, part := range s.part[1:] {
		for j, v := range part {
			s.wp[j] += v
		}
	}
	l.unpermute(dw[:l.o*l.K], s.wp)
	rows := p.B * l.T
	bs := s.bsum[0]
	colSum(bs, dout, rows, l.o)
	db := dw[l.o*l.K:]
	for o, v := range bs {
		db[o] = float32(float64(alpha) * v)
	}
}

// ---------------------------------------------------------------- pooling

// pool is max or average pooling without padding, on (H, W, C) layout.
type pool struct {
	noParams
	max                   bool
	c, h, w, k, s, ho, wo int
}

func (l *pool) outShape() []int { return []int{l.c, l.ho, l.wo} }

type poolState struct{ arg []int32 }

func (l *pool) newState(maxB, workers int, needDin bool) any {
	if l.max {
		return &poolState{arg: make([]int32, maxB*l.c*l.ho*l.wo)}
	}
	return nil
}

func (l *pool) forward(p *pass, w, in, out []float32, st any) {
	nin, nout := l.h*l.w*l.c, l.ho*l.wo*l.c
	p.parFor(p.B, nout*l.k*l.k, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			x, y := in[i*nin:(i+1)*nin], out[i*nout:(i+1)*nout]
			if l.max {
				l.maxForward(y, st.(*poolState).arg[i*nout:(i+1)*nout], x)
			} else {
				l.avgForward(y, x)
			}
		}
	})
}

// rowOffsets returns where output row oh starts in y and where its window
// element (kh, kw) for ow = 0 starts in x: y[yo+ow·c+ch] pairs with
// x[xo+ow·s·c+ch], so the inner loops run over whole output rows.
func (l *pool) rowOffsets(oh, kh, kw int) (yo, xo int) {
	return oh * l.wo * l.c, ((oh*l.s+kh)*l.w + kw) * l.c
}

// maxForward takes window maxima and records in arg the input index of
// each maximum (the first in kh, kw order). The conditional updates are
// written as selects so the compiler can emit conditional moves: with random
// data the comparison is unpredictable.
func (l *pool) maxForward(y []float32, arg []int32, x []float32) {
	rowLen, c, step := l.wo*l.c, l.c, l.s*l.c
	for oh := 0; oh < l.ho; oh++ {
		for kh := 0; kh < l.k; kh++ {
			for kw := 0; kw < l.k; kw++ {
				yo, xo := l.rowOffsets(oh, kh, kw)
				yr, ar := y[yo:yo+rowLen], arg[yo:yo+rowLen]
				first := kh == 0 && kw == 0
				for ow := 0; ow < l.wo; ow++ {
					xb := xo + ow*step
					xs := x[xb : xb+c]
					ys, as := yr[ow*c:(ow+1)*c], ar[ow*c:(ow+1)*c]
					if first {
						copy(ys, xs)
						for ch := range as {
							as[ch] = int32(xb + ch)
						}
						continue
					}
					for ch, v := range xs {
						cur, a := ys[ch], as[ch]
						if v > cur {
							a = int32(xb + ch)
						}
						as[ch] = a
						ys[ch] = max(cur, v)
					}
				}
			}
		}
	}
}

func (l *pool) avgForward(y, x []float32) {
	rowLen, c, step := l.wo*l.c, l.c, l.s*l.c
	inv := 1 / float32(l.k*l.k)
	clear(y)
	for oh := 0; oh < l.ho; oh++ {
		for kh := 0; kh < l.k; kh++ {
			for kw := 0; kw < l.k; kw++ {
				yo, xo := l.rowOffsets(oh, kh, kw)
				yr := y[yo : yo+rowLen]
				for ow := 0; ow < l.wo; ow++ {
					xs := x[xo+ow*step : xo+ow*step+c]
					ys := yr[ow*c : (ow+1)*c]
					for ch, v := range xs {
						ys[ch] += v
					}
				}
			}
		}
	}
	for j := range y {
		y[j] *= inv
	}
}

func (l *pool) backward(p *pass, w, in, out, dout, din []float32, st any) {
	if din == nil {
		return
	}
	nin, nout := l.h*l.w*l.c, l.ho*l.wo*l.c
	inv := 1 / float32(l.k*l.k)
	p.parFor(p.B, nout*l.k*l.k, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			dx, dy := din[i*nin:(i+1)*nin], dout[i*nout:(i+1)*nout]
			clear(dx)
			if l.max {
				for o, a := range st.(*poolState).arg[i*nout : (i+1)*nout] {
					dx[a] += dy[o]
				}
				continue
			}
			rowLen, c, step := l.wo*l.c, l.c, l.s*l.c
			for oh := 0; oh < l.ho; oh++ {
				for kh := 0; kh < l.k; kh++ {
					for kw := 0; kw < l.k; kw++ {
						yo, xo := l.rowOffsets(oh, kh, kw)
						yr := dy[yo : yo+rowLen]
						for ow := 0; ow < l.wo; ow++ {
							xs := dx[xo+ow*step : xo+ow*step+c]
							for ch, g := range yr[ow*c : (ow+1)*c] {
								xs[ch] += g * inv
							}
						}
					}
				}
			}
		}
	})
}

// ---------------------------------------------------------------- embedding bag

// embedBag is the mean of the embeddings of an example's non-padding
// tokens (id -1 is padding; an all-padding example maps to zero).
//
// Example i's gradient has row v equal to (n_{iv}/nᵢ) δᵢ, with n_{iv} the
// count of token v and nᵢ the number of tokens, so its squared norm is
// ‖δᵢ‖² Σ_v (n_{iv}/nᵢ)²: the ghost norm of an embedding (Li et al. 2022
// treat embeddings as linear layers on one-hot inputs).
type embedBag struct {
	L, V, D int
}

type embedState struct {
	inv    []float32 // 1/nᵢ (0 for all-padding examples)
	tokens [][]int32 // per worker [L]
}

func (l *embedBag) outShape() []int { return []int{l.D} }
func (l *embedBag) paramShapes() []paramShape {
	return []paramShape{{"weight", []int{l.V, l.D}}}
}
func (l *embedBag) init(w []float32, rng *rand.Rand) {
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
}
func (l *embedBag) newState(maxB, workers int, needDin bool) any {
	st := &embedState{inv: make([]float32, maxB)}
	for range workers {
		st.tokens = append(st.tokens, make([]int32, l.L))
	}
	return st
}

func (l *embedBag) forward(p *pass, w, in, out []float32, st any) {
	s := st.(*embedState)
	p.parFor(p.B, l.L*l.D, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			y := out[i*l.D : (i+1)*l.D]
			clear(y)
			n := 0
			for _, t := range in[i*l.L : (i+1)*l.L] {
				if t < 0 {
					continue
				}
				n++
				e := w[int(t)*l.D : (int(t)+1)*l.D]
				for j, v := range e {
					y[j] += v
				}
			}
			s.inv[i] = 0
			if n > 0 {
				s.inv[i] = 1 / float32(n)
				for j := range y {
					y[j] *= s.inv[i]
				}
			}
		}
	})
}

func (l *embedBag) backward(p *pass, w, in, out, dout, din []float32, st any) {}

// bound: example i's gradient has row v equal to n_{iv}·invᵢ·dᵢ, with invᵢ
// the stored float32 1/nᵢ that paramGrad and accGrad use, so its norm is
// ‖dᵢ‖·invᵢ·√(Σ_v n_{iv}²) exactly (float64 evaluation only). accGrad
// adds the exact float64 products invᵢ·d'ᵢ once per token occurrence:
// its shares are the scaling error (u32·‖Gᵢ‖ plus underflow) and the
// accumulator's accGamma·ρᵢ with ρᵢ = nᵢ·invᵢ·‖dᵢ‖.
func (l *embedBag) bound(p *pass, in, out, dout []float32, b clipBounds, st any) {
	s := st.(*embedState)
	p.parFor(p.B, l.L*4, func(wk, lo, hi int) {
		tok := s.tokens[wk]
		for i := lo; i < hi; i++ {
			var n int
			var c2 float64
			tok, n, c2 = tokenCounts(tok, in[i*l.L:(i+1)*l.L])
			if n > 0 {
				l.boundExample(b, i, n, c2, s.inv[i], sumSq(dout[i*l.D:(i+1)*l.D]))
			}
		}
	})
}

// tokenCounts returns an example's number of tokens n (ids ≥ 0; -1 is
// padding) and c2 = Σ_v n_v² over its distinct tokens v (exact), using tok
// as scratch (returned, possibly grown).
func tokenCounts(tok []int32, ids []float32) ([]int32, int, float64) {
	tok = tok[:0]
	for _, t := range ids {
		if t >= 0 {
			tok = append(tok, int32(t))
		}
	}
	slices.Sort(tok)
	var c2 float64
	run := 1
	for j := 1; j <= len(tok); j++ {
		if j < len(tok) && tok[j] == tok[j-1] {
			run++
			continue
		}
		c2 += float64(run) * float64(run)
		run = 1
	}
	return tok, len(tok), c2
}

// boundExample adds the bounds of example i, with ntok > 0 tokens, c2 =
// Σ_v n_{iv}² (exact), inv its stored 1/nᵢ and d2 = Σ dᵢ² (float64): the
// one place the embedding bag's bound formula lives, for the CPU and the
// GPU engine.
func (l *embedBag) boundExample(b clipBounds, i, ntok int, c2 float64, inv32 float32, d2 float64) {
	up := boundSlack(l.L + l.D)
	sD := math.Sqrt(float64(l.D))
	inv := float64(inv32)
	dn := math.Sqrt(d2)
	g := dn * math.Sqrt(c2) * inv * up
	rho := float64(ntok) * inv * dn * up
	b.sq[i] += g * g
	b.share[i] += u32*g + accGamma*(1+u32)*rho
	b.floor[i] += eta32 * sD * math.Sqrt(c2) * inv * (1 + accGamma) * up
}

func (l *embedBag) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32, st any) {
	s := st.(*embedState)
	clear(dw)
	for i := 0; i < p.B; i++ {
		sc := alpha * s.inv[i]
		d := dout[i*l.D : (i+1)*l.D]
		for _, t := range in[i*l.L : (i+1)*l.L] {
			if t < 0 {
				continue
			}
			g := dw[int(t)*l.D : (int(t)+1)*l.D]
			for j, v := range d {
				g[j] += sc * v
			}
		}
	}
}

// accGrad adds into acc directly (the float64 products are exact), then
// rounds it into dst if final.
func (l *embedBag) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32, st any) {
	s := st.(*embedState)
	if p.fresh {
		clear(acc)
	}
	for i := 0; i < p.B; i++ {
		inv := float64(s.inv[i])
		d := dout[i*l.D : (i+1)*l.D]
		for _, t := range in[i*l.L : (i+1)*l.L] {
			if t < 0 {
				continue
			}
			g := acc[int(t)*l.D : (int(t)+1)*l.D]
			for j, v := range d {
				g[j] += inv * float64(v)
			}
		}
	}
	if p.final {
		for j, v := range acc {
			dst[j] = float32(v)
		}
	}
}

// clearExample clears the output gradient only: token ids and 1/nᵢ are
// finite, and the gradient is linear in it.
func (l *embedBag) clearExample(i int, in, dout []float32, st any) {
	clear(dout[i*l.D : (i+1)*l.D])
}

// ---------------------------------------------------------------- layer norm

// layerNorm normalizes each example over all its features (Ba, Kiros and
// Hinton 2016, "Layer Normalization"), then applies an elementwise gain and
// bias. Per-example gain and bias gradients (δᵢ∘x̂ᵢ, δᵢ) are as small as
// the activations, so their norms are computed directly.
type layerNorm struct {
	f   int
	eps float64
}

type lnState struct {
	xhat   []float32
	rstd   []float32
	gs, bs []float64
}

func (l *layerNorm) outShape() []int { return []int{l.f} }
func (l *layerNorm) paramShapes() []paramShape {
	return []paramShape{{"weight", []int{l.f}}, {"bias", []int{l.f}}}
}
func (l *layerNorm) init(w []float32, rng *rand.Rand) {
	for j := 0; j < l.f; j++ {
		w[j], w[l.f+j] = 1, 0
	}
}
func (l *layerNorm) newState(maxB, workers int, needDin bool) any {
	return &lnState{xhat: make([]float32, maxB*l.f), rstd: make([]float32, maxB),
		gs: make([]float64, l.f), bs: make([]float64, l.f)}
}

func (l *layerNorm) forward(p *pass, w, in, out []float32, st any) {
	s := st.(*lnState)
	g, b := w[:l.f], w[l.f:]
	p.parFor(p.B, l.f*4, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			x, xh, y := in[i*l.f:(i+1)*l.f], s.xhat[i*l.f:(i+1)*l.f], out[i*l.f:(i+1)*l.f]
			var mu float64
			for _, v := range x {
				mu += float64(v)
			}
			mu /= float64(l.f)
			var vr float64
			for _, v := range x {
				d := float64(v) - mu
				vr += d * d
			}
			vr /= float64(l.f)
			r := 1 / math.Sqrt(vr+l.eps)
			s.rstd[i] = float32(r)
			for j, v := range x {
				xh[j] = float32((float64(v) - mu) * r)
				y[j] = g[j]*xh[j] + b[j]
			}
		}
	})
}

func (l *layerNorm) backward(p *pass, w, in, out, dout, din []float32, st any) {
	if din == nil {
		return
	}
	s := st.(*lnState)
	g := w[:l.f]
	p.parFor(p.B, l.f*4, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			xh, dy, dx := s.xhat[i*l.f:(i+1)*l.f], dout[i*l.f:(i+1)*l.f], din[i*l.f:(i+1)*l.f]
			var m1, m2 float64
			for j, v := range dy {
				d := float64(v) * float64(g[j])
				m1 += d
				m2 += d * float64(xh[j])
			}
			m1 /= float64(l.f)
			m2 /= float64(l.f)
			r := float64(s.rstd[i])
			for j, v := range dy {
				d := float64(v) * float64(g[j])
				dx[j] = float32(r * (d - m1 - float64(xh[j])*m2))
			}
		}
	})
}

// bound: example i's gradient (dᵢ∘x̂ᵢ, dᵢ) is computed exactly in float64
// (products of two float32 values), so its norm needs only the float64
// evaluation slack, and being entrywise it has no cancellation: its shares
// are the scaling error (u32·‖Gᵢ‖, plus eta32·‖(x̂ᵢ, 1)‖ from underflow)
// and two float64 sums (accGamma·‖Gᵢ‖ each).
func (l *layerNorm) bound(p *pass, in, out, dout []float32, b clipBounds, st any) {
	s := st.(*lnState)
	for i := 0; i < p.B; i++ {
		xh, dy := s.xhat[i*l.f:(i+1)*l.f], dout[i*l.f:(i+1)*l.f]
		var n, x2 float64
		for j, v := range dy {
			d, x := float64(v), float64(xh[j])
			gx := d * x
			n += gx*gx + d*d
			x2 += x * x
		}
		l.boundExample(b, i, n, x2)
	}
}

// boundExample adds example i's bounds from n = Σ (dⱼx̂ⱼ)² + dⱼ² and
// x2 = Σ x̂ⱼ², summed in float64: the one place the layer norm's bound
// formula lives, for the CPU and the GPU engine.
func (l *layerNorm) boundExample(b clipBounds, i int, n, x2 float64) {
	up := boundSlack(2 * l.f)
	lam := u32 + 2*accGamma*(1+u32)
	n *= up
	b.sq[i] += n
	b.share[i] += lam * math.Sqrt(n)
	b.floor[i] += eta32 * math.Sqrt(x2+float64(l.f)) * (1 + 2*accGamma) * up
}

// sums writes the batch sums of the gain and bias gradients,
// Σᵢ δᵢ∘x̂ᵢ and Σᵢ δᵢ, into s.gs and s.bs, in float64, in example order.
func (l *layerNorm) sums(p *pass, dout []float32, s *lnState) {
	clear(s.gs)
	clear(s.bs)
	for i := 0; i < p.B; i++ {
		xh, dy := s.xhat[i*l.f:(i+1)*l.f], dout[i*l.f:(i+1)*l.f]
		for j, v := range dy {
			s.gs[j] += float64(v) * float64(xh[j])
			s.bs[j] += float64(v)
		}
	}
}

func (l *layerNorm) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32, st any) {
	s := st.(*lnState)
	l.sums(p, dout, s)
	for j := 0; j < l.f; j++ {
		dw[j] = float32(float64(alpha) * s.gs[j])
		dw[l.f+j] = float32(float64(alpha) * s.bs[j])
	}
}

func (l *layerNorm) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32, st any) {
	s := st.(*lnState)
	l.sums(p, dout, s)
	put64(acc[:l.f], dst[:l.f], s.gs, p.fresh, p.final)
	put64(acc[l.f:], dst[l.f:], s.bs, p.fresh, p.final)
}

func (l *layerNorm) clearExample(i int, in, dout []float32, st any) {
	s := st.(*lnState)
	clear(s.xhat[i*l.f : (i+1)*l.f])
	clear(dout[i*l.f : (i+1)*l.f])
}

// tanh32 is a float32 tanh: the clamped rational approximation of Eigen's
// generic_fast_tanh_float (Eigen, MathFunctionsImpl.h; a 13/6-degree
// minimax rational function), accurate to a few float32 ulps; it is several
// times faster than math.Tanh in float64. TestTanh32 checks it against
// math.Tanh.
func tanh32(x float32) float32 {
	const clamp = 7.90531110763549805
	if x > clamp {
		x = clamp
	} else if x < -clamp {
		x = -clamp
	}
	if x < 0.0004 && x > -0.0004 {
		return x
	}
	const (
		a1  = 4.89352455891786e-03
		a3  = 6.37261928875436e-04
		a5  = 1.48572235717979e-05
		a7  = 5.12229709037114e-08
		a9  = -8.60467152213735e-11
		a11 = 2.00018790482477e-13
		a13 = -2.76076847742355e-16
		b0  = 4.89352518554385e-03
		b2  = 2.26843463243900e-03
		b4  = 1.18534705686654e-04
		b6  = 1.19825839466702e-06
	)
	x2 := x * x
	p := x * (a1 + x2*(a3+x2*(a5+x2*(a7+x2*(a9+x2*(a11+x2*a13))))))
	q := b0 + x2*(b2+x2*(b4+x2*b6))
	return p / q
}

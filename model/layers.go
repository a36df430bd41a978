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
	// sqNorms adds each example's squared gradient norm (this layer's
	// parameters only) to acc[i].
	sqNorms(p *pass, in, out, dout []float32, acc []float64, st any)
	// paramGrad writes dw = alpha · Σ_i (example i's parameter gradient).
	paramGrad(p *pass, dw, in, out, dout []float32, alpha float32, st any)
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
		// "book-keeping"): the ghost norm costs ~T²(K+O) per example (two
		// T×T Gram matrices), materializing the per-example weight gradient
		// costs ~T·O·K. Pick the cheaper.
		cv.ghost = cv.T*(cv.K+cv.o) < cv.o*cv.K
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
func (noParams) sqNorms(*pass, []float32, []float32, []float32, []float64, any)            {}
func (noParams) paramGrad(*pass, []float32, []float32, []float32, []float32, float32, any) {}

// ---------------------------------------------------------------- linear

// linear is y = W x + b with W [out, in].
//
// Per-example gradient of example i is (δᵢ aᵢᵀ, δᵢ), so its squared norm is
// ‖δᵢ‖²(‖aᵢ‖² + 1) without materializing it (Goodfellow 2015, "Efficient
// per-example gradient computations"; Li et al. 2022, "ghost clipping").
type linear struct {
	in, out int
}

type linearState struct{ bsum []float64 }

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

func (l *linear) sqNorms(p *pass, in, out, dout []float32, acc []float64, st any) {
	for i := 0; i < p.B; i++ {
		a := sumSq(in[i*l.in : (i+1)*l.in])
		d := sumSq(dout[i*l.out : (i+1)*l.out])
		acc[i] += d * (a + 1)
	}
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

// sumSq returns Σ v² accumulated in float64.
func sumSq(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return s
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
	scratch     [][]float32 // per worker: [T·T]·2 (ghost) or [O·K]
	bsum        [][]float64 // per worker [O]
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
	}
	if needDin {
		st.dcols = make([]float32, maxB*l.T*l.K)
	}
	n := l.o * l.K
	if l.ghost {
		n = 2 * l.T * l.T
	}
	for range workers {
		st.scratch = append(st.scratch, make([]float32, n))
		st.bsum = append(st.bsum, make([]float64, l.o))
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

func (l *conv) unpermute(dst, w []float32) {
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

func (l *conv) sqNorms(p *pass, in, out, dout []float32, acc []float64, st any) {
	s := st.(*convState)
	T, K, O := l.T, l.K, l.o
	p.par(p.B, func(wk, lo, hi int) {
		sc, bs := s.scratch[wk], s.bsum[wk]
		for i := lo; i < hi; i++ {
			D := dout[i*T*O : (i+1)*T*O]
			A := s.cols[i*T*K : (i+1)*T*K]
			colSum(bs, D, T, O)
			var n float64
			for _, v := range bs {
				n += v * v
			}
			if l.ghost {
				ga, gd := sc[:T*T], sc[T*T:]
				p.be.Sgemm(false, true, T, T, K, 1, A, K, A, K, 0, ga, T)
				p.be.Sgemm(false, true, T, T, O, 1, D, O, D, O, 0, gd, T)
				for j, v := range ga {
					n += float64(v) * float64(gd[j])
				}
			} else {
				p.be.Sgemm(true, false, O, K, T, 1, D, O, A, K, 0, sc, K)
				n += sumSq(sc)
			}
			acc[i] += n
		}
	})
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

func (l *embedBag) sqNorms(p *pass, in, out, dout []float32, acc []float64, st any) {
	s := st.(*embedState)
	p.parFor(p.B, l.L*4, func(wk, lo, hi int) {
		tok := s.tokens[wk]
		for i := lo; i < hi; i++ {
			tok = tok[:0]
			for _, t := range in[i*l.L : (i+1)*l.L] {
				if t >= 0 {
					tok = append(tok, int32(t))
				}
			}
			if len(tok) == 0 {
				continue
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
			nn := float64(len(tok))
			acc[i] += sumSq(dout[i*l.D:(i+1)*l.D]) * c2 / (nn * nn)
		}
	})
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

func (l *layerNorm) sqNorms(p *pass, in, out, dout []float32, acc []float64, st any) {
	s := st.(*lnState)
	for i := 0; i < p.B; i++ {
		xh, dy := s.xhat[i*l.f:(i+1)*l.f], dout[i*l.f:(i+1)*l.f]
		var n float64
		for j, v := range dy {
			d := float64(v)
			gx := d * float64(xh[j])
			n += gx*gx + d*d
		}
		acc[i] += n
	}
}

func (l *layerNorm) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32, st any) {
	s := st.(*lnState)
	clear(s.gs)
	clear(s.bs)
	for i := 0; i < p.B; i++ {
		xh, dy := s.xhat[i*l.f:(i+1)*l.f], dout[i*l.f:(i+1)*l.f]
		for j, v := range dy {
			s.gs[j] += float64(v) * float64(xh[j])
			s.bs[j] += float64(v)
		}
	}
	for j := 0; j < l.f; j++ {
		dw[j] = float32(float64(alpha) * s.gs[j])
		dw[l.f+j] = float32(float64(alpha) * s.bs[j])
	}
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

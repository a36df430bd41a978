package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// linear is y = W x + b with W [out, in], or y = W x without a bias
// (noBias).
//
// Per-example gradient of example i is (δᵢ aᵢᵀ, δᵢ), so its squared norm is
// ‖δᵢ‖²(‖aᵢ‖² + 1) without materializing it (Goodfellow 2015, "Efficient
// per-example gradient computations"; Li et al. 2022, "ghost clipping");
// without a bias it is δᵢ aᵢᵀ, of squared norm ‖δᵢ‖²‖aᵢ‖².
type linear struct {
	in, out int
	noBias  bool
}

// newLinear checks a linear layer spec against its input shape.
func newLinear(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if len(in) != 1 {
		return nil, errors.New("linear needs a flat input; add a flatten layer before it")
	}
	if ls.LoRA != nil {
		return nil, errors.New("lora adapts linear layers on sequences ([T, D] inputs) only")
	}
	if ls.Out < 1 || ls.Out > maxElems {
		return nil, fmt.Errorf("out = %d, need ≥ 1", ls.Out)
	}
	if shapeSize([]int{ls.Out, in[0]}) < 1 {
		return nil, errors.New("weight too large")
	}
	return &linear{in: in[0], out: ls.Out, noBias: ls.NoBias}, nil
}

// linearState is a linear layer's kernels with one workspace's buffers.
type linearState struct {
	l    *linear
	bsum []float64
	blk  []float32 // accGrad's block product [out, in], allocated on first use
}

func (l *linear) outShape() []int { return []int{l.out} }
func (l *linear) paramShapes() []paramShape {
	return weightBias(l.out, []int{l.out, l.in}, l.noBias)
}

// weightBias returns the parameters of a layer with out outputs: a weight
// of the given shape and, unless noBias, a bias [out].
func weightBias(out int, weight []int, noBias bool) []paramShape {
	if noBias {
		return []paramShape{{"weight", weight}}
	}
	return []paramShape{{"weight", weight}, {"bias", []int{out}}}
}
func (l *linear) init(w []float32, rng *rand.Rand) {
	uniformInit(w, 1/math.Sqrt(float64(l.in)), rng)
}
func (l *linear) newState(maxB, workers int, needDin bool) layerState {
	return &linearState{l: l, bsum: make([]float64, l.out)}
}

func (s *linearState) forward(p *pass, w, in, out []float32) {
	l := s.l
	W, b := w[:l.out*l.in], w[l.out*l.in:] // b is empty without a bias
	p.be.Sgemm(false, true, p.B, l.out, l.in, 1, in, l.in, W, l.in, 0, out, l.out)
	for i := 0; i < p.B && !l.noBias; i++ {
		row := out[i*l.out : (i+1)*l.out]
		for o, bv := range b {
			row[o] += bv
		}
	}
}

func (s *linearState) backward(p *pass, w, in, out, dout, din []float32) {
	l := s.l
	if din == nil {
		return
	}
	p.be.Sgemm(false, false, p.B, l.in, l.out, 1, dout, l.out, w[:l.out*l.in], l.in, 0, din, l.in)
}

// bound: example i's gradient is dᵢ ãᵢᵀ with ãᵢ = (aᵢ, 1) (ãᵢ = aᵢ
// without a bias), so ‖Gᵢ‖ = ‖dᵢ‖·‖ãᵢ‖ exactly, computed from float64 sums of exact squares
// (relative error below boundSlack); it is also ρᵢ, so the shares are
// proportional to the norm itself. accGrad's error per example: scaling
// dᵢ by cᵢ in float32 (u32·cᵢρᵢ, plus eta32·√O·‖ãᵢ‖ from underflow), the
// block product (γ_{blockRows}(u32)·cᵢρᵢ(1+u32), plus eta32·√(O·K) for
// products that underflow), the float64 bias sum and accumulator
// (accGamma each; charged with or without a bias, an over-estimate of
// accGamma·ρᵢ without one).
func (s *linearState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	l := s.l
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
	if !l.noBias {
		a2++ // ãᵢ = (aᵢ, 1)
	}
	g := math.Sqrt(d2*a2) * up
	b.sq[i] += g * g
	b.share[i] += lam * g
	b.floor[i] += eta32 * (sO*math.Sqrt(a2)*(1+gR) + sOK) * up
}

func (s *linearState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	l := s.l
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
	if !l.noBias {
		colSum(s.bsum, dout, p.B, O)
		put64(acc[O*K:], dst[O*K:], s.bsum, p.fresh, p.final)
	}
}

func (s *linearState) clearExample(i int, in, dout []float32) {
	l := s.l
	clear(in[i*l.in : (i+1)*l.in])
	clear(dout[i*l.out : (i+1)*l.out])
}

func (s *linearState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	l := s.l
	p.be.Sgemm(true, false, l.out, l.in, p.B, alpha, dout, l.out, in, l.in, 0, dw[:l.out*l.in], l.in)
	if l.noBias {
		return
	}
	colSum(s.bsum, dout, p.B, l.out)
	db := dw[l.out*l.in:]
	for o, v := range s.bsum {
		db[o] = float32(float64(alpha) * v)
	}
}

package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// layerNorm normalizes each example over all its features (Ba, Kiros and
// Hinton 2016, "Layer Normalization"), then applies an elementwise gain and
// bias. Per-example gain and bias gradients (δᵢ∘x̂ᵢ, δᵢ) are as small as
// the activations, so their norms are computed directly.
type layerNorm struct {
	f   int
	eps float64
}

// newLayerNorm checks a layernorm layer spec against its input shape.
func newLayerNorm(ls LayerSpec, in []int) (layer, error) {
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
}

// lnState is a layer norm's kernels with one workspace's buffers.
type lnState struct {
	l      *layerNorm
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
func (l *layerNorm) newState(maxB, workers int, needDin bool) layerState {
	return &lnState{l: l, xhat: make([]float32, maxB*l.f), rstd: make([]float32, maxB),
		gs: make([]float64, l.f), bs: make([]float64, l.f)}
}

func (s *lnState) forward(p *pass, w, in, out []float32) {
	l := s.l
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

func (s *lnState) backward(p *pass, w, in, out, dout, din []float32) {
	l := s.l
	if din == nil {
		return
	}
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
func (s *lnState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	l := s.l
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

func (s *lnState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	l := s.l
	l.sums(p, dout, s)
	for j := 0; j < l.f; j++ {
		dw[j] = float32(float64(alpha) * s.gs[j])
		dw[l.f+j] = float32(float64(alpha) * s.bs[j])
	}
}

func (s *lnState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	l := s.l
	l.sums(p, dout, s)
	put64(acc[:l.f], dst[:l.f], s.gs, p.fresh, p.final)
	put64(acc[l.f:], dst[l.f:], s.bs, p.fresh, p.final)
}

func (s *lnState) clearExample(i int, in, dout []float32) {
	l := s.l
	clear(s.xhat[i*l.f : (i+1)*l.f])
	clear(dout[i*l.f : (i+1)*l.f])
}

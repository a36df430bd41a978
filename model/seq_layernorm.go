package model

import (
	"math"
	"math/rand/v2"
)

// seqLayerNorm normalizes each position of a [T, F] sequence over its F
// values, with one gain and bias [F] shared by the positions (PyTorch's
// LayerNorm(F) on the last dimension). Rows are independent, so its
// forward, backward and batch sums are layerNorm's over B·T rows; only the
// per-example bound groups the T rows of an example.
type seqLayerNorm struct {
	*layerNorm
	t int
}

// newSeqLayerNorm checks a layernorm layer spec against a [T, F] input.
func newSeqLayerNorm(ls LayerSpec, in []int) (layer, error) {
	l, err := newLayerNorm(ls, in[1:])
	if err != nil {
		return nil, err
	}
	return &seqLayerNorm{layerNorm: l.(*layerNorm), t: in[0]}, nil
}

func (l *seqLayerNorm) outShape() []int                  { return []int{l.t, l.f} }
func (l *seqLayerNorm) init(w []float32, rng *rand.Rand) { l.layerNorm.init(w, rng) }
func (l *seqLayerNorm) newState(maxB, workers int, needDin bool) layerState {
	st := &seqLNState{rows: l.layerNorm.newState(maxB*l.t, workers, needDin).(*lnState), l: l}
	for range workers {
		st.scratch = append(st.scratch, make([]float64, 4*l.f))
	}
	return st
}

// seqLNState runs the row kernels of lnState on B·T rows.
type seqLNState struct {
	rows    *lnState
	l       *seqLayerNorm
	scratch [][]float64 // per worker [4F], bound's sums
}

// rowPass is p over the B·T rows of the batch.
func (s *seqLNState) rowPass(p *pass) *pass {
	q := *p
	q.B = p.B * s.l.t
	return &q
}

func (s *seqLNState) forward(p *pass, w, in, out []float32) { s.rows.forward(s.rowPass(p), w, in, out) }
func (s *seqLNState) backward(p *pass, w, in, out, dout, din []float32) {
	s.rows.backward(s.rowPass(p), w, in, out, dout, din)
}
func (s *seqLNState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	s.rows.paramGrad(s.rowPass(p), dw, in, out, dout, alpha)
}
func (s *seqLNState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	s.rows.accGrad(s.rowPass(p), acc, dst, in, out, dout)
}

func (s *seqLNState) clearExample(i int, in, dout []float32) {
	n := s.l.t * s.l.f
	clear(s.rows.xhat[i*n : (i+1)*n])
	clear(dout[i*n : (i+1)*n])
}

// bound: example i's gradient is G = (Σₜ dₜ∘x̂ₜ, Σₜ dₜ) over its T
// positions. Each entry is a float64 sum of T exact products, so the
// computed Ĝ has entrywise error at most γ_T(u64)·Σₜ|dₜⱼx̂ₜⱼ| (Higham
// 2002, §3.1), and in norm at most γ_T(u64)·ρ with ρ = ‖(Σₜ|dₜ∘x̂ₜ|,
// Σₜ|dₜ|)‖ ≥ ‖G‖ (the sums of magnitudes, which no cancellation can
// shrink): the bound is (‖Ĝ‖ + γ_T(u64)·ρ)², so however the positions
// cancel, ‖G‖ is never under-estimated. accGrad adds the float32-scaled
// dₜ (u32 per element) times x̂ₜ exactly into two float64 sums (accGamma
// each), so its shares are (u32 + 2·accGamma(1+u32))·ρ, and the underflow
// of the scaling (eta32 per element) adds at most
// eta32·Σₜ‖(x̂ₜ, 1)‖·(1 + 2·accGamma).
func (s *seqLNState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	l := s.l
	T, F := l.t, l.f
	p.parFor(p.B, T*F*4, func(wk, lo, hi int) {
		sc := s.scratch[wk]
		gs, bs, ga, ba := sc[:F], sc[F:2*F], sc[2*F:3*F], sc[3*F:]
		for i := lo; i < hi; i++ {
			clear(sc)
			var xn float64
			for t := 0; t < T; t++ {
				r := (i*T + t) * F
				xh, dy := s.rows.xhat[r:r+F], dout[r:r+F]
				var x2 float64
				for j, v := range dy {
					d, x := float64(v), float64(xh[j])
					gs[j] += d * x
					bs[j] += d
					ga[j] += math.Abs(d * x)
					ba[j] += math.Abs(d)
					x2 += x * x
				}
				xn += math.Sqrt(x2 + float64(F))
			}
			var n, rho float64
			for j := range gs {
				n += gs[j]*gs[j] + bs[j]*bs[j]
				rho += ga[j]*ga[j] + ba[j]*ba[j]
			}
			l.boundSeqExample(b, i, n, rho, xn)
		}
	})
}

// boundSeqExample adds example i's bounds from n = ‖Ĝ‖², rho2 = ρ² and
// xn = Σₜ‖(x̂ₜ, 1)‖ (see seqLNState.bound): the one place the formula
// lives.
func (l *seqLayerNorm) boundSeqExample(b clipBounds, i int, n, rho2, xn float64) {
	up := boundSlack(2*l.f + l.t)
	rho := math.Sqrt(rho2) * up
	g := (math.Sqrt(n)*up + gamma(l.t, u64)*rho) * up
	b.sq[i] += g * g
	b.share[i] += (u32 + 2*accGamma*(1+u32)) * rho
	b.floor[i] += eta32 * xn * (1 + 2*accGamma) * up
}

package model

import (
	"errors"
	"fmt"
	"math"
)

// attention is multi-head causal self-attention without parameters
// (Vaswani et al. 2017, "Attention Is All You Need", eq. 1, with a causal
// mask): its input [T, 3D] holds, at each position t, the query qₜ, key kₜ
// and value vₜ (D values each, H heads of D/H), and for each head
//
//	outₜ = Σ_{u≤t} Pₜᵤ vᵤ,  Pₜ = softmax_{u≤t}(qₜ·kᵤ / √(D/H)).
//
// The query, key, value and output projections are the linear layers
// around it, so their per-example gradients are those of linear maps at T
// positions (seqLinear); this layer only has a backward pass.
type attention struct {
	noParams
	T, D, H, dh int
	scale       float32
}

// newAttention checks an attention layer spec against its [T, 3D] input.
func newAttention(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if len(in) != 2 || in[1]%3 != 0 {
		return nil, errors.New("attention needs a [T, 3D] input (queries, keys and values; put a linear layer of 3D outputs before it)")
	}
	d := in[1] / 3
	if ls.Heads < 1 || d%ls.Heads != 0 {
		return nil, fmt.Errorf("heads = %d must be ≥ 1 and divide D = %d", ls.Heads, d)
	}
	if shapeSize([]int{ls.Heads, in[0], in[0]}) < 1 {
		return nil, errors.New("layer too large")
	}
	dh := d / ls.Heads
	return &attention{T: in[0], D: d, H: ls.Heads, dh: dh, scale: float32(1 / math.Sqrt(float64(dh)))}, nil
}

func (a *attention) outShape() []int { return []int{a.T, a.D} }
func (a *attention) newState(maxB, workers int, needDin bool) layerState {
	st := &attnState{a: a, probs: make([]float32, maxB*a.H*a.T*a.T)}
	for range workers {
		st.row = append(st.row, make([]float32, a.T))
	}
	return st
}

// attnState holds each example's attention probabilities for backward.
type attnState struct {
	noParams
	a     *attention
	probs []float32   // [B, H, T, T], row t holds Pₜᵤ for u ≤ t
	row   [][]float32 // per worker [T]
}

// qkv returns the offsets of head h's query, key and value in a position's
// 3D input values.
func (a *attention) qkv(h int) (q, k, v int) {
	return h * a.dh, a.D + h*a.dh, 2*a.D + h*a.dh
}

func (s *attnState) forward(p *pass, w, in, out []float32) {
	a := s.a
	T, D3, D, dh := a.T, 3*a.D, a.D, a.dh
	p.parFor(p.B, T*T*D, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			x, y := in[i*T*D3:(i+1)*T*D3], out[i*T*D:(i+1)*T*D]
			clear(y)
			for h := 0; h < a.H; h++ {
				qo, ko, vo := a.qkv(h)
				P := s.probs[(i*a.H+h)*T*T : (i*a.H+h+1)*T*T]
				for t := 0; t < T; t++ {
					q := x[t*D3+qo : t*D3+qo+dh]
					pr := P[t*T : t*T+t+1]
					mx := float32(math.Inf(-1))
					for u := range pr {
						pr[u] = dot32(q, x[u*D3+ko:u*D3+ko+dh]) * a.scale
						mx = max(mx, pr[u])
					}
					var se float64
					for u, v := range pr {
						e := math.Exp(float64(v - mx))
						pr[u] = float32(e)
						se += e
					}
					inv := float32(1 / se)
					o := y[t*D+h*dh : t*D+(h+1)*dh]
					for u := range pr {
						pr[u] *= inv
						axpy32(o, pr[u], x[u*D3+vo:u*D3+vo+dh])
					}
				}
			}
		}
	})
}

// backward: with Gₜ = ∂loss/∂outₜ (per head), ∂vᵤ = Σ_{t≥u} Pₜᵤ Gₜ,
// ∂Pₜᵤ = Gₜ·vᵤ, ∂Sₜᵤ = Pₜᵤ(∂Pₜᵤ − Σᵤ' Pₜᵤ' ∂Pₜᵤ') (the softmax's
// Jacobian), ∂qₜ = s·Σᵤ ∂Sₜᵤ kᵤ and ∂kᵤ = s·Σₜ ∂Sₜᵤ qₜ, s = 1/√(D/H).
func (s *attnState) backward(p *pass, w, in, out, dout, din []float32) {
	a := s.a
	if din == nil {
		return
	}
	T, D3, D, dh := a.T, 3*a.D, a.D, a.dh
	p.parFor(p.B, T*T*D*2, func(wk, lo, hi int) {
		dp := s.row[wk]
		for i := lo; i < hi; i++ {
			x, g, dx := in[i*T*D3:(i+1)*T*D3], dout[i*T*D:(i+1)*T*D], din[i*T*D3:(i+1)*T*D3]
			clear(dx)
			for h := 0; h < a.H; h++ {
				qo, ko, vo := a.qkv(h)
				P := s.probs[(i*a.H+h)*T*T : (i*a.H+h+1)*T*T]
				for t := 0; t < T; t++ {
					gt := g[t*D+h*dh : t*D+(h+1)*dh]
					pr := P[t*T : t*T+t+1]
					var m float32
					for u, pv := range pr {
						dp[u] = dot32(gt, x[u*D3+vo:u*D3+vo+dh])
						m += pv * dp[u]
						axpy32(dx[u*D3+vo:u*D3+vo+dh], pv, gt)
					}
					q, dq := x[t*D3+qo:t*D3+qo+dh], dx[t*D3+qo:t*D3+qo+dh]
					for u, pv := range pr {
						ds := pv * (dp[u] - m) * a.scale
						axpy32(dq, ds, x[u*D3+ko:u*D3+ko+dh])
						axpy32(dx[u*D3+ko:u*D3+ko+dh], ds, q)
					}
				}
			}
		}
	})
}

func dot32(a, b []float32) float32 {
	var s float32
	b = b[:len(a)]
	for j, v := range a {
		s += v * b[j]
	}
	return s
}

// axpy32 adds alpha·x to y.
func axpy32(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	for j, v := range x {
		y[j] += alpha * v
	}
}

// meanPool is the mean over the T positions of a [T, D] sequence.
type meanPool struct {
	noParams
	T, D int
}

// newMeanPool checks a meanpool layer spec against its [T, D] input.
func newMeanPool(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if len(in) != 2 {
		return nil, errors.New("meanpool needs a [T, D] sequence input")
	}
	return &meanPool{T: in[0], D: in[1]}, nil
}

func (m *meanPool) outShape() []int                                     { return []int{m.D} }
func (m *meanPool) newState(maxB, workers int, needDin bool) layerState { return m }

func (m *meanPool) forward(p *pass, w, in, out []float32) {
	inv := 1 / float32(m.T)
	for i := 0; i < p.B; i++ {
		y := out[i*m.D : (i+1)*m.D]
		clear(y)
		for t := 0; t < m.T; t++ {
			axpy32(y, 1, in[(i*m.T+t)*m.D:(i*m.T+t+1)*m.D])
		}
		for j := range y {
			y[j] *= inv
		}
	}
}

func (m *meanPool) backward(p *pass, w, in, out, dout, din []float32) {
	if din == nil {
		return
	}
	inv := 1 / float32(m.T)
	for i := 0; i < p.B; i++ {
		g := dout[i*m.D : (i+1)*m.D]
		for t := 0; t < m.T; t++ {
			dx := din[(i*m.T+t)*m.D : (i*m.T+t+1)*m.D]
			for j, v := range g {
				dx[j] = v * inv
			}
		}
	}
}

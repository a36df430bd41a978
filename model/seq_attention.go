package model

import (
	"errors"
	"fmt"
	"math"
)

// attention is multi-head self-attention without parameters (Vaswani et
// al. 2017, "Attention Is All You Need", eq. 1), causal or over the
// positions that are not padding: its input [T, 3D] holds, at each
// position t, the query qₜ, key kₜ and value vₜ (D values each, H heads of
// D/H), and for each head
//
//	outₜ = Σ_{u∈Kₜ} Pₜᵤ vᵤ,  Pₜ = softmax_{u∈Kₜ}(qₜ·kᵤ / √(D/H)),
//
// with keys Kₜ = {u ≤ t} (causal, GPT-2) or Kₜ = {u : idᵤ ≠ −1}, the
// positions whose model-input token is not padding (padding; BERT's
// attention_mask, which needs the token ids: pass.ids). A query with no
// key outputs zeros and passes no gradient.
//
// The query, key, value and output projections are the linear layers
// around it, so their per-example gradients are those of linear maps at T
// positions (seqLinear); this layer only has a backward pass.
type attention struct {
	noParams
	T, D, H, dh int
	scale       float32
	padding     bool
	all         []int32 // 0, 1, …, T−1: the causal keys of position t are all[:t+1]
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
	var padding bool
	switch ls.Mask {
	case "", MaskCausal:
	case MaskPadding:
		padding = true
	default:
		return nil, fmt.Errorf("mask %q: want %q (the default) or %q", ls.Mask, MaskCausal, MaskPadding)
	}
	dh := d / ls.Heads
	a := &attention{T: in[0], D: d, H: ls.Heads, dh: dh, scale: float32(1 / math.Sqrt(float64(dh))), padding: padding}
	a.all = make([]int32, a.T)
	for u := range a.all {
		a.all[u] = int32(u)
	}
	return a, nil
}

func (a *attention) outShape() []int { return []int{a.T, a.D} }
func (a *attention) newState(maxB, workers int, needDin bool) layerState {
	st := &attnState{a: a, probs: make([]float32, maxB*a.H*a.T*a.T)}
	for range workers {
		st.row = append(st.row, make([]float32, a.T))
		st.keys = append(st.keys, make([]int32, 0, a.T))
	}
	return st
}

// attnState holds each example's attention probabilities for backward.
type attnState struct {
	noParams
	a     *attention
	probs []float32   // [B, H, T, T], row t holds Pₜᵤ at u for u ∈ Kₜ
	row   [][]float32 // per worker [T]
	keys  [][]int32   // per worker: an example's keys with a padding mask
}

// qkv returns the offsets of head h's query, key and value in a position's
// 3D input values.
func (a *attention) qkv(h int) (q, k, v int) {
	return h * a.dh, a.D + h*a.dh, 2*a.D + h*a.dh
}

// exampleKeys returns example i's keys with a padding mask, its
// non-padding positions in increasing order (in worker wk's buffer), or
// nil for causal attention; keysOf then gives query t's keys.
func (s *attnState) exampleKeys(p *pass, wk, i int) []int32 {
	a := s.a
	if !a.padding {
		return nil
	}
	ks := s.keys[wk][:0]
	for u, id := range p.ids[i*a.T : (i+1)*a.T] {
		if id >= 0 {
			ks = append(ks, int32(u))
		}
	}
	s.keys[wk] = ks
	return ks
}

// keysOf returns the keys Kₜ of query t, given its example's keys from
// exampleKeys.
func (a *attention) keysOf(t int, keys []int32) []int32 {
	if a.padding {
		return keys
	}
	return a.all[:t+1]
}

func (s *attnState) forward(p *pass, w, in, out []float32) {
	a := s.a
	T, D3, D, dh := a.T, 3*a.D, a.D, a.dh
	p.parFor(p.B, T*T*D, func(wk, lo, hi int) {
		for i := lo; i < hi; i++ {
			x, y := in[i*T*D3:(i+1)*T*D3], out[i*T*D:(i+1)*T*D]
			clear(y)
			keys := s.exampleKeys(p, wk, i)
			for h := 0; h < a.H; h++ {
				qo, ko, vo := a.qkv(h)
				P := s.probs[(i*a.H+h)*T*T : (i*a.H+h+1)*T*T]
				for t := 0; t < T; t++ {
					ks := a.keysOf(t, keys)
					if len(ks) == 0 {
						continue
					}
					q := x[t*D3+qo : t*D3+qo+dh]
					pr := P[t*T : (t+1)*T]
					mx := float32(math.Inf(-1))
					for _, u := range ks {
						pr[u] = dot32(q, x[int(u)*D3+ko:int(u)*D3+ko+dh]) * a.scale
						mx = max(mx, pr[u])
					}
					var se float64
					for _, u := range ks {
						e := math.Exp(float64(pr[u] - mx))
						pr[u] = float32(e)
						se += e
					}
					inv := float32(1 / se)
					o := y[t*D+h*dh : t*D+(h+1)*dh]
					for _, u := range ks {
						pr[u] *= inv
						axpy32(o, pr[u], x[int(u)*D3+vo:int(u)*D3+vo+dh])
					}
				}
			}
		}
	})
}

// backward: with Gₜ = ∂loss/∂outₜ (per head), ∂vᵤ = Σ_{t: u∈Kₜ} Pₜᵤ Gₜ,
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
			keys := s.exampleKeys(p, wk, i)
			for h := 0; h < a.H; h++ {
				qo, ko, vo := a.qkv(h)
				P := s.probs[(i*a.H+h)*T*T : (i*a.H+h+1)*T*T]
				for t := 0; t < T; t++ {
					ks := a.keysOf(t, keys)
					gt := g[t*D+h*dh : t*D+(h+1)*dh]
					pr := P[t*T : (t+1)*T]
					var m float32
					for _, u := range ks {
						pv := pr[u]
						dp[u] = dot32(gt, x[int(u)*D3+vo:int(u)*D3+vo+dh])
						m += pv * dp[u]
						axpy32(dx[int(u)*D3+vo:int(u)*D3+vo+dh], pv, gt)
					}
					q, dq := x[t*D3+qo:t*D3+qo+dh], dx[t*D3+qo:t*D3+qo+dh]
					for _, u := range ks {
						ds := pr[u] * (dp[u] - m) * a.scale
						axpy32(dq, ds, x[int(u)*D3+ko:int(u)*D3+ko+dh])
						axpy32(dx[int(u)*D3+ko:int(u)*D3+ko+dh], ds, q)
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

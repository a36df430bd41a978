package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/dpcluster/dpcluster/dataset"
)

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

// newEmbedBag checks an embeddingbag layer spec; idx is its position in
// the model (it must be first).
func newEmbedBag(idx int, ls LayerSpec, in []int) (layer, error) {
	if err := checkTokenInput("embeddingbag", "[L]", idx, ls, in); err != nil {
		return nil, err
	}
	return &embedBag{L: in[0], V: ls.Vocab, D: ls.Dim}, nil
}

// checkTokenInput checks a layer of kind that embeds token ids: the first
// layer (idx 0), on a one-dimensional input (shape names it), with
// 1 ≤ Vocab ≤ dataset.MaxTokenID, Dim ≥ 1 and a weight and output whose
// sizes fit an int.
func checkTokenInput(kind, shape string, idx int, ls LayerSpec, in []int) error {
	if err := unused(ls, "out", "kernel", "stride", "pad", "eps"); err != nil {
		return err
	}
	if idx != 0 {
		return fmt.Errorf("%s must be the first layer (its input is token ids)", kind)
	}
	if len(in) != 1 {
		return fmt.Errorf("%s needs a %s token input", kind, shape)
	}
	if ls.Vocab < 1 || ls.Vocab > dataset.MaxTokenID || ls.Dim < 1 || shapeSize([]int{ls.Vocab, ls.Dim}) < 1 || shapeSize([]int{in[0], ls.Dim}) < 1 {
		return fmt.Errorf("need 1 ≤ vocab ≤ %d and dim ≥ 1 (got vocab %d dim %d)", dataset.MaxTokenID, ls.Vocab, ls.Dim)
	}
	return nil
}

// embedState is an embedding bag's kernels with one workspace's buffers.
type embedState struct {
	l      *embedBag
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
func (l *embedBag) newState(maxB, workers int, needDin bool) layerState {
	st := &embedState{l: l, inv: make([]float32, maxB)}
	for range workers {
		st.tokens = append(st.tokens, make([]int32, l.L))
	}
	return st
}

func (s *embedState) forward(p *pass, w, in, out []float32) {
	l := s.l
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

func (s *embedState) backward(p *pass, w, in, out, dout, din []float32) {}

// bound: example i's gradient has row v equal to n_{iv}·invᵢ·dᵢ, with invᵢ
// the stored float32 1/nᵢ that paramGrad and accGrad use, so its norm is
// ‖dᵢ‖·invᵢ·√(Σ_v n_{iv}²) exactly (float64 evaluation only). accGrad
// adds the exact float64 products invᵢ·d'ᵢ once per token occurrence:
// its shares are the scaling error (u32·‖Gᵢ‖ plus underflow) and the
// accumulator's accGamma·ρᵢ with ρᵢ = nᵢ·invᵢ·‖dᵢ‖.
func (s *embedState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	l := s.l
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

func (s *embedState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	l := s.l
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
func (s *embedState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	l := s.l
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
func (s *embedState) clearExample(i int, in, dout []float32) {
	l := s.l
	clear(dout[i*l.D : (i+1)*l.D])
}

package model

import (
	"math"
	"math/rand/v2"
	"slices"
)

// seqEmbed maps T token ids to [T, D]: row t is the token's embedding
// (zero for padding, id -1) plus the learned embedding of position t.
//
// Example i's gradient is sparse: token row v is Σ_{t: idₜ=v} dₜ over the
// positions holding v, position row t is dₜ. The bound sums each token's
// rows in float64 (the sparse per-example gradient, as embedBag does), so
// repeated tokens are counted exactly; nothing of size Vocab is touched
// per example.
type seqEmbed struct {
	T, V, D int
}

// newSeqEmbed checks an embedding layer spec; idx is its position in the
// model (it must be first).
func newSeqEmbed(idx int, ls LayerSpec, in []int) (layer, error) {
	if err := checkTokenInput("embedding", "[T]", idx, ls, in); err != nil {
		return nil, err
	}
	return &seqEmbed{T: in[0], V: ls.Vocab, D: ls.Dim}, nil
}

func (l *seqEmbed) outShape() []int { return []int{l.T, l.D} }
func (l *seqEmbed) paramShapes() []paramShape {
	return []paramShape{{"weight", []int{l.V, l.D}}, {"pos", []int{l.T, l.D}}}
}

// init draws token and position embeddings from N(0, 1) (PyTorch's
// nn.Embedding).
func (l *seqEmbed) init(w []float32, rng *rand.Rand) {
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
}

func (l *seqEmbed) newState(maxB, workers int, needDin bool) layerState {
	st := &seqEmbedState{l: l}
	for range workers {
		st.order = append(st.order, make([]int32, l.T))
		st.sum = append(st.sum, make([]float64, 2*l.D))
	}
	return st
}

// seqEmbedState is an embedding's kernels with one workspace's buffers.
type seqEmbedState struct {
	l     *seqEmbed
	order [][]int32   // per worker [T]: positions sorted by token
	sum   [][]float64 // per worker [2D]: a token row's sum and sum of magnitudes
}

func (s *seqEmbedState) forward(p *pass, w, in, out []float32) {
	l := s.l
	tok, pos := w[:l.V*l.D], w[l.V*l.D:]
	p.parFor(p.B, l.T*l.D, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			for t, id := range in[i*l.T : (i+1)*l.T] {
				y := out[(i*l.T+t)*l.D : (i*l.T+t+1)*l.D]
				copy(y, pos[t*l.D:(t+1)*l.D])
				if id < 0 {
					continue
				}
				for j, v := range tok[int(id)*l.D : (int(id)+1)*l.D] {
					y[j] += v
				}
			}
		}
	})
}

func (s *seqEmbedState) backward(p *pass, w, in, out, dout, din []float32) {}

// bound: example i's gradient (token rows Σ_{t: idₜ=v} dₜ, position rows
// dₜ) is formed token by token in float64 (exact products; each sum of at
// most T terms has entrywise error γ_T(u64) of its sum of magnitudes), so
// with ρ = 2·Σₜ‖dₜ‖ ≥ ‖G‖ the norm is ‖Ĝ‖ + γ_T(u64)·ρ at most, whatever
// the rows cancel. accGrad adds each float32-scaled dₜ (u32 per element,
// eta32 from underflow) once to a token row and once to a position row of
// the float64 accumulator (accGamma): shares (u32 + accGamma(1+u32))·ρ,
// floor eta32·√D·(T + √T)·(1 + accGamma) (a token row gathers up to T
// underflow errors, a position row one).
func (s *seqEmbedState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	l := s.l
	T, D := l.T, l.D
	p.parFor(p.B, T*D*2, func(wk, lo, hi int) {
		ord, acc := s.order[wk], s.sum[wk][:D]
		for i := lo; i < hi; i++ {
			ids := in[i*T : (i+1)*T]
			dy := dout[i*T*D : (i+1)*T*D]
			var n, rho float64
			for t := 0; t < T; t++ {
				d2 := sumSq(dy[t*D : (t+1)*D])
				n += d2 // position row t
				rho += 2 * math.Sqrt(d2)
			}
			ord = tokenOrder(ord, ids)
			for j := 0; j < len(ord); {
				k := j
				clear(acc)
				for ; k < len(ord) && ids[ord[k]] == ids[ord[j]]; k++ {
					for e, v := range dy[int(ord[k])*D : (int(ord[k])+1)*D] {
						acc[e] += float64(v)
					}
				}
				for _, v := range acc {
					n += v * v
				}
				j = k
			}
			l.boundExample(b, i, n, rho)
		}
	})
}

// tokenOrder writes into ord the positions of the non-padding ids, sorted by
// (id, position), and returns it (re-sliced).
func tokenOrder(ord []int32, ids []float32) []int32 {
	ord = ord[:0]
	for t, id := range ids {
		if id >= 0 {
			ord = append(ord, int32(t))
		}
	}
	slices.SortFunc(ord, func(a, b int32) int {
		if ids[a] != ids[b] {
			if ids[a] < ids[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	return ord
}

// boundExample adds example i's bounds from n = ‖Ĝ‖² and rho = 2·Σₜ‖dₜ‖
// (see bound): the one place the formula lives.
func (l *seqEmbed) boundExample(b clipBounds, i int, n, rho float64) {
	up := boundSlack(2*l.T + l.D)
	rho *= up
	g := (math.Sqrt(n)*up + gamma(l.T, u64)*rho) * up
	b.sq[i] += g * g
	b.share[i] += (u32 + accGamma*(1+u32)) * rho
	b.floor[i] += eta32 * math.Sqrt(float64(l.D)) * (float64(l.T) + math.Sqrt(float64(l.T))) * (1 + accGamma) * up
}

func (s *seqEmbedState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	clear(dw)
	addSeqEmbedGrad(s.l, dw, p.B, in, dout, alpha)
}

// accGrad adds into acc directly, in example and position order, then
// rounds it into dst if final.
func (s *seqEmbedState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	if p.fresh {
		clear(acc)
	}
	addSeqEmbedGrad(s.l, acc, p.B, in, dout, 1)
	if p.final {
		for j, v := range acc {
			dst[j] = float32(v)
		}
	}
}

// addSeqEmbedGrad adds alpha·dout into g, the layer's token and position
// tables laid out as its parameters, for the B examples' token ids in, in
// example and position order (the order fixes the bits); a padding id
// (< 0) adds to its position's row only.
func addSeqEmbedGrad[F float32 | float64](l *seqEmbed, g []F, B int, in, dout []float32, alpha F) {
	tok, pos := g[:l.V*l.D], g[l.V*l.D:]
	add := func(row []F, d []float32) {
		for j, v := range d {
			row[j] += alpha * F(v)
		}
	}
	for i := 0; i < B; i++ {
		for t, id := range in[i*l.T : (i+1)*l.T] {
			d := dout[(i*l.T+t)*l.D : (i*l.T+t+1)*l.D]
			add(pos[t*l.D:(t+1)*l.D], d)
			if id >= 0 {
				add(tok[int(id)*l.D:(int(id)+1)*l.D], d)
			}
		}
	}
}

// clearExample clears the output gradient only: token ids are finite and
// the gradient is linear in it.
func (s *seqEmbedState) clearExample(i int, in, dout []float32) {
	l := s.l
	clear(dout[i*l.T*l.D : (i+1)*l.T*l.D])
}

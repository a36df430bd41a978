package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// seqEmbed maps T token ids to [T, D]: row t is the token's embedding
// (zero for padding, id -1) plus row t+off of the learned position table
// plus, with a token-type table (NT > 0 rows), the row of position t's
// type: the number of sep ids at positions before t, capped at NT−1
// (BERT's segments, whose [SEP] ends each; positions after the last [SEP]
// continue its count, padding included).
//
// Example i's gradient is sparse: token row v is Σ_{t: idₜ=v} dₜ over the
// positions holding v, position row t+off is dₜ, type row k is
// Σ_{t: typeₜ=k} dₜ, and every other row is zero. The bound sums each
// token's and each type's rows in float64 (the sparse per-example
// gradient, as embedBag does), so repeated tokens and types are counted
// exactly; nothing of size Vocab or Positions is touched per example.
type seqEmbed struct {
	T, V, D int
	// P is the number of position rows (≥ T + off) and off the row of
	// position 0.
	P, off int
	// NT is the number of token-type rows (0: no table) and sep the id
	// that ends a segment (used when NT ≥ 2).
	NT  int
	sep float32
}

// newSeqEmbed checks an embedding layer spec; idx is its position in the
// model (it must be first).
func newSeqEmbed(idx int, ls LayerSpec, in []int) (layer, error) {
	if err := checkTokenInput("embedding", "[T]", idx, ls, in); err != nil {
		return nil, err
	}
	l := &seqEmbed{T: in[0], V: ls.Vocab, D: ls.Dim, P: ls.Positions, off: ls.PosOffset, NT: ls.Types}
	if l.P == 0 {
		l.P = l.T
	}
	if l.off < 0 || l.off > maxElems || l.P < 0 || l.P-l.off < l.T {
		return nil, fmt.Errorf("need pos_offset ≥ 0 and positions ≥ T + pos_offset = %d + %d (got positions %d; 0 means T)", l.T, ls.PosOffset, ls.Positions)
	}
	if l.NT < 0 {
		return nil, fmt.Errorf("types = %d, need ≥ 0", l.NT)
	}
	switch {
	case l.NT >= 2 && ls.TypeSep == nil:
		return nil, fmt.Errorf("types = %d needs type_sep, the token id that ends a segment ([SEP])", l.NT)
	case l.NT < 2 && ls.TypeSep != nil:
		return nil, fmt.Errorf("type_sep needs types ≥ 2 (got types %d)", l.NT)
	case ls.TypeSep != nil:
		if *ls.TypeSep < 0 || *ls.TypeSep >= l.V {
			return nil, fmt.Errorf("type_sep = %d, need a token id in [0, vocab = %d)", *ls.TypeSep, l.V)
		}
		l.sep = float32(*ls.TypeSep)
	}
	if shapeSize([]int{l.P, l.D}) < 1 || (l.NT > 0 && shapeSize([]int{l.NT, l.D}) < 1) {
		return nil, errors.New("position or type table too large")
	}
	return l, nil
}

func (l *seqEmbed) outShape() []int { return []int{l.T, l.D} }
func (l *seqEmbed) paramShapes() []paramShape {
	ps := []paramShape{{"weight", []int{l.V, l.D}}, {"pos", []int{l.P, l.D}}}
	if l.NT > 0 {
		ps = append(ps, paramShape{"types", []int{l.NT, l.D}})
	}
	return ps
}

// tables splits the layer's parameters (or gradient) into its token,
// position and type tables (typ is empty without one).
func tables[F float32 | float64](l *seqEmbed, w []F) (tok, pos, typ []F) {
	vd, pd := l.V*l.D, l.P*l.D
	return w[:vd], w[vd : vd+pd], w[vd+pd:]
}

// nextType returns the type of the position after one of type k that
// holds id: one more after a segment's end (sep), capped at NT−1.
func (l *seqEmbed) nextType(k int, id float32) int {
	if id == l.sep && k < l.NT-1 {
		return k + 1
	}
	return k
}

// nTables is the number of tables each dₜ is added to: token, position
// and, if present, type.
func (l *seqEmbed) nTables() int {
	if l.NT > 0 {
		return 3
	}
	return 2
}

// init draws token, position and type embeddings from N(0, 1) (PyTorch's
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
		st.sum = append(st.sum, make([]float64, l.D))
	}
	return st
}

// seqEmbedState is an embedding's kernels with one workspace's buffers.
type seqEmbedState struct {
	l     *seqEmbed
	order [][]int32   // per worker [T]: positions sorted by token
	sum   [][]float64 // per worker [D]: a token's or a type's row
}

func (s *seqEmbedState) forward(p *pass, w, in, out []float32) {
	l := s.l
	tok, pos, typ := tables(l, w)
	p.parFor(p.B, l.T*l.D, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			k := 0
			for t, id := range in[i*l.T : (i+1)*l.T] {
				y := out[(i*l.T+t)*l.D : (i*l.T+t+1)*l.D]
				copy(y, pos[(t+l.off)*l.D:(t+l.off+1)*l.D])
				if id >= 0 {
					axpy32(y, 1, tok[int(id)*l.D:(int(id)+1)*l.D])
				}
				if l.NT > 0 {
					axpy32(y, 1, typ[k*l.D:(k+1)*l.D])
					k = l.nextType(k, id)
				}
			}
		}
	})
}

func (s *seqEmbedState) backward(p *pass, w, in, out, dout, din []float32) {}

// bound: example i's gradient (token rows Σ_{t: idₜ=v} dₜ, position rows
// dₜ, type rows Σ_{t: typeₜ=k} dₜ) is formed row by row in float64 (exact
// products; each sum of at most T terms has entrywise error γ_T(u64) of
// its sum of magnitudes), so with ρ = m·Σₜ‖dₜ‖ ≥ ‖G‖, m the number of
// tables (2, or 3 with types), the norm is ‖Ĝ‖ + γ_T(u64)·ρ at most,
// whatever the rows cancel. ‖Ĝ‖² is a float64 sum over at most m·T rows of
// each row's sum of D squares: fewer than m·T + D additions deep, within
// boundSlack(m·T + D). accGrad adds each float32-scaled dₜ (u32 per
// element, eta32 from underflow) once to a row of each table of the
// float64 accumulator (accGamma): shares (u32 + accGamma(1+u32))·ρ, floor
// eta32·√D·((m−1)·T + √T)·(1 + accGamma) (a token or type row gathers up
// to T underflow errors, a position row one).
func (s *seqEmbedState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	l := s.l
	T, D := l.T, l.D
	m := float64(l.nTables())
	p.parFor(p.B, T*D*l.nTables(), func(wk, lo, hi int) {
		ord, acc := s.order[wk], s.sum[wk]
		for i := lo; i < hi; i++ {
			ids := in[i*T : (i+1)*T]
			dy := dout[i*T*D : (i+1)*T*D]
			var n, rho float64
			for t := 0; t < T; t++ {
				d2 := sumSq(dy[t*D : (t+1)*D])
				n += d2 // position row t + off
				rho += m * math.Sqrt(d2)
			}
			// Token rows: the positions of each token, in position order.
			ord = tokenOrder(ord, ids)
			for j := 0; j < len(ord); {
				k := j
				clear(acc)
				for ; k < len(ord) && ids[ord[k]] == ids[ord[j]]; k++ {
					addRow(acc, dy[int(ord[k])*D:(int(ord[k])+1)*D])
				}
				n += sumSq64(acc)
				j = k
			}
			// Type rows: a type's positions are consecutive.
			if l.NT > 0 {
				clear(acc)
				k := 0
				for t, id := range ids {
					addRow(acc, dy[t*D:(t+1)*D])
					if next := l.nextType(k, id); next != k || t == T-1 {
						n += sumSq64(acc)
						clear(acc)
						k = next
					}
				}
			}
			l.boundExample(b, i, n, rho)
		}
	})
}

// addRow adds the float32 values d to the float64 row acc.
func addRow(acc []float64, d []float32) {
	for e, v := range d {
		acc[e] += float64(v)
	}
}

// sumSq64 returns Σ v² in float64, in order.
func sumSq64(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return s
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

// boundExample adds example i's bounds from n = ‖Ĝ‖² and rho = m·Σₜ‖dₜ‖
// (see bound): the one place the formula lives, for the CPU and the GPU
// engine.
func (l *seqEmbed) boundExample(b clipBounds, i int, n, rho float64) {
	m := l.nTables()
	up := boundSlack(m*l.T + l.D)
	rho *= up
	g := (math.Sqrt(n)*up + gamma(l.T, u64)*rho) * up
	b.sq[i] += g * g
	b.share[i] += (u32 + accGamma*(1+u32)) * rho
	b.floor[i] += eta32 * math.Sqrt(float64(l.D)) * (float64((m-1)*l.T) + math.Sqrt(float64(l.T))) * (1 + accGamma) * up
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

// addSeqEmbedGrad adds alpha·dout into g, the layer's token, position and
// type tables laid out as its parameters, for the B examples' token ids
// in, in example and position order (the order fixes the bits); a padding
// id (< 0) adds to its position's and its type's rows only.
func addSeqEmbedGrad[F float32 | float64](l *seqEmbed, g []F, B int, in, dout []float32, alpha F) {
	tok, pos, typ := tables(l, g)
	D := l.D
	add := func(row []F, d []float32) {
		for j, v := range d {
			row[j] += alpha * F(v)
		}
	}
	for i := 0; i < B; i++ {
		k := 0
		for t, id := range in[i*l.T : (i+1)*l.T] {
			d := dout[(i*l.T+t)*D : (i*l.T+t+1)*D]
			add(pos[(t+l.off)*D:(t+l.off+1)*D], d)
			if id >= 0 {
				add(tok[int(id)*D:(int(id)+1)*D], d)
			}
			if l.NT > 0 {
				add(typ[k*D:(k+1)*D], d)
				k = l.nextType(k, id)
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

package model

import (
	"math"
	"slices"
	"testing"
)

// The float64 reference of the sequence layers and the NextToken loss,
// written as direct loops over [T, D] values (no im2col, no BLAS), in the
// style of ref_test.go.

// refNextTokenLoss is the mean over examples of each example's mean
// next-token cross-entropy over its non-padding targets (0 if none).
func refNextTokenLoss(t testing.TB, m *Model, theta []float64, x []float32) float64 {
	t.Helper()
	d, T, V := m.InputSize(), m.seqT, m.classes
	B := len(x) / d
	var total float64
	for i := 0; i < B; i++ {
		ex := x[i*d : (i+1)*d]
		z := refForward(t, m, theta, ex)
		var sum float64
		n := 0
		for p := 0; p < T; p++ {
			tg := int(ex[p+1])
			if tg < 0 {
				continue
			}
			n++
			row := z[p*V : (p+1)*V]
			mx := math.Inf(-1)
			for _, v := range row {
				mx = math.Max(mx, v)
			}
			var se float64
			for _, v := range row {
				se += math.Exp(v - mx)
			}
			sum += mx + math.Log(se) - row[tg]
		}
		if n > 0 {
			total += sum / float64(n)
		}
	}
	return total / float64(B)
}

// refSeqLayer applies a sequence layer (or linear or layer norm on a
// [T, D] input, or a layer inside a residual block); ok is false for the
// other layers, which refLayer handles. ids is the example's model input.
func refSeqLayer(t testing.TB, ly layer, ls LayerSpec, w, x []float64, shape []int, ids []float64) (y []float64, sh []int, ok bool) {
	switch {
	case ls.Type == Embedding:
		e := ly.(*seqEmbed)
		T, D := shape[0], ls.Dim
		types := refTokenTypes(ls, x)
		y = make([]float64, T*D)
		for p := 0; p < T; p++ {
			for j := 0; j < D; j++ {
				v := w[ls.Vocab*D+(p+ls.PosOffset)*D+j]
				if id := int(x[p]); id >= 0 {
					v += w[id*D+j]
				}
				if ls.Types > 0 {
					v += w[(ls.Vocab+e.P+types[p])*D+j]
				}
				y[p*D+j] = v
			}
		}
		return y, []int{T, D}, true
	case ls.Type == Linear && len(shape) == 2:
		T, in, out := shape[0], shape[1], ls.Out
		y = make([]float64, T*out)
		for p := 0; p < T; p++ {
			for o := 0; o < out; o++ {
				s := refBias(ls, w, out*in+o)
				for j := 0; j < in; j++ {
					s += w[o*in+j] * x[p*in+j]
				}
				y[p*out+o] = s
			}
		}
		if lr := ls.LoRA; lr != nil {
			// y[Lo:Hi] += (Alpha/Rank)·B (A x) at every position.
			r, sc, n := lr.Rank, lr.Alpha/float64(lr.Rank), out*in+out
			parts := lr.Parts
			if len(parts) == 0 {
				parts = []LoRAPart{{Lo: 0, Hi: out}}
			}
			for _, pt := range parts {
				a, b := w[n:n+r*in], w[n+r*in:n+r*in+(pt.Hi-pt.Lo)*r]
				n += r*in + (pt.Hi-pt.Lo)*r
				for p := 0; p < T; p++ {
					u := make([]float64, r)
					for k := range u {
						for j := 0; j < in; j++ {
							u[k] += a[k*in+j] * x[p*in+j]
						}
					}
					for o := pt.Lo; o < pt.Hi; o++ {
						for k, uv := range u {
							y[p*out+o] += sc * b[(o-pt.Lo)*r+k] * uv
						}
					}
				}
			}
		}
		return y, []int{T, out}, true
	case ls.Type == LayerNorm && len(shape) == 2:
		T, f := shape[0], shape[1]
		y = make([]float64, T*f)
		for p := 0; p < T; p++ {
			row := x[p*f : (p+1)*f]
			var mu, vr float64
			for _, v := range row {
				mu += v
			}
			mu /= float64(f)
			for _, v := range row {
				vr += (v - mu) * (v - mu)
			}
			vr /= float64(f)
			r := 1 / math.Sqrt(vr+ls.Eps)
			for j, v := range row {
				y[p*f+j] = (v-mu)*r*w[j] + w[f+j]
			}
		}
		return y, shape, true
	case ls.Type == Attention:
		return refAttention(x, shape[0], shape[1]/3, ls.Heads, ls.Mask, ids), []int{shape[0], shape[1] / 3}, true
	case ls.Type == FirstToken || ls.Type == LastToken:
		T, D := shape[0], shape[1]
		p := 0
		for u := T - 1; u > 0 && ls.Type == LastToken; u-- {
			if ids[u] >= 0 {
				p = u
				break
			}
		}
		return slices.Clone(x[p*D : (p+1)*D]), []int{D}, true
	case ls.Type == MeanPool:
		T, D := shape[0], shape[1]
		y = make([]float64, D)
		for p := 0; p < T; p++ {
			for j := 0; j < D; j++ {
				y[j] += x[p*D+j] / float64(T)
			}
		}
		return y, []int{D}, true
	case ls.Type == Residual:
		r := ly.(*residual)
		f, fs := append([]float64(nil), x...), shape
		for j, inner := range ls.Layers {
			f, fs = refLayer(t, r.layers[j], inner, w[r.off[j]:r.off[j]+r.size[j]], f, fs, ids)
		}
		y = make([]float64, len(x))
		for k := range y {
			y[k] = x[k] + f[k]
		}
		return y, shape, true
	}
	return nil, nil, false
}

// refTokenTypes returns the token type of each position of ids under an
// embedding spec ls, as BERT's token_type_ids are: 0 up to and including
// the first TypeSep, then one more after each TypeSep, capped at
// Types−1; all 0 with fewer than two types.
func refTokenTypes(ls LayerSpec, ids []float64) []int {
	types := make([]int, len(ids))
	seps := 0
	for p, id := range ids {
		types[p] = min(seps, max(ls.Types-1, 0))
		if ls.TypeSep != nil && int(id) == *ls.TypeSep {
			seps++
		}
	}
	return types
}

// refAttention is multi-head attention on x [T, 3D] in float64: causal
// (mask "" or "causal"), or each query over the positions whose id is not
// padding (mask "padding"; zeros where there is none).
func refAttention(x []float64, T, D, H int, mask string, ids []float64) []float64 {
	dh := D / H
	y := make([]float64, T*D)
	for h := 0; h < H; h++ {
		for p := 0; p < T; p++ {
			var keys []int
			for u := 0; u < T; u++ {
				if (mask == MaskPadding && ids[u] >= 0) || (mask != MaskPadding && u <= p) {
					keys = append(keys, u)
				}
			}
			s := make([]float64, len(keys))
			mx := math.Inf(-1)
			for k, u := range keys {
				var dot float64
				for j := 0; j < dh; j++ {
					dot += x[p*3*D+h*dh+j] * x[u*3*D+D+h*dh+j]
				}
				s[k] = dot / math.Sqrt(float64(dh))
				mx = math.Max(mx, s[k])
			}
			var se float64
			for k := range s {
				s[k] = math.Exp(s[k] - mx)
				se += s[k]
			}
			for k, u := range keys {
				for j := 0; j < dh; j++ {
					y[p*D+h*dh+j] += s[k] / se * x[u*3*D+2*D+h*dh+j]
				}
			}
		}
	}
	return y
}

// refSeqGrad writes example i's exact gradient of a sequence layer (ly,
// state st, input in, output gradient dout; stored values) into g, as
// refGradsStored does for the other layers; ok is false for those.
func refSeqGrad(ly layer, st layerState, in, dout []float32, i int, g []float64) bool {
	switch ly := ly.(type) {
	case *seqLinear:
		T, K, O := ly.T, ly.K, ly.o
		A, D := st.(*convState).cols[i*T*K:(i+1)*T*K], dout[i*T*O:(i+1)*T*O]
		for p := 0; p < T; p++ {
			for o := 0; o < O; o++ {
				dv := float64(D[p*O+o])
				for k := 0; k < K; k++ {
					g[o*K+k] += dv * float64(A[p*K+k])
				}
				if !ly.noBias {
					g[O*K+o] += dv
				}
			}
		}
	case *loraLinear:
		ls, n := st.(*loraState), 0
		for k, part := range ly.parts {
			ps := &ls.parts[k]
			na, nb := part.down.o*part.down.K, part.up.o*part.up.K
			refLayerGrad(&seqLinear{part.down}, ps.down, in, ps.du, i, g[n:n+na])
			refLayerGrad(&seqLinear{part.up}, ps.up, ps.u, ps.g, i, g[n+na:n+na+nb])
			n += na + nb
		}
	case *seqLayerNorm:
		T, f := ly.t, ly.f
		xh := st.(*seqLNState).rows.xhat
		for p := 0; p < T; p++ {
			r := (i*T + p) * f
			for j := 0; j < f; j++ {
				g[j] += float64(dout[r+j]) * float64(xh[r+j])
				g[f+j] += float64(dout[r+j])
			}
		}
	case *seqEmbed:
		T, D := ly.T, ly.D
		ids := make([]float64, T)
		for p, id := range in[i*T : (i+1)*T] {
			ids[p] = float64(id)
		}
		ls := LayerSpec{Types: ly.NT}
		if ly.NT >= 2 {
			sep := int(ly.sep)
			ls.TypeSep = &sep
		}
		types := refTokenTypes(ls, ids)
		for p, id := range ids {
			for j := 0; j < D; j++ {
				dv := float64(dout[(i*T+p)*D+j])
				g[(ly.V+p+ly.off)*D+j] += dv
				if id >= 0 {
					g[int(id)*D+j] += dv
				}
				if ly.NT > 0 {
					g[(ly.V+ly.P+types[p])*D+j] += dv
				}
			}
		}
	case *residual:
		rs := st.(*resState)
		for j, inner := range ly.layers {
			if rs.trains(j) {
				o := rs.rel[j]
				refLayerGrad(inner, rs.states[j], rs.act[j], rs.grad[j+1], i, g[o:o+rs.size[j]])
			}
		}
	default:
		return false
	}
	return true
}

// withGhost returns l with its per-example norm strategy set: convolutions
// and sequence linear layers, also inside residual blocks, take the ghost
// norm (ghost = true) or materialize per-example gradients; other layers
// are returned as they are.
func withGhost(l layer, ghost bool) layer {
	switch l := l.(type) {
	case *conv:
		cp := *l
		cp.ghost = ghost
		return &cp
	case *seqLinear:
		cp := *l.conv
		cp.ghost = ghost
		return &seqLinear{&cp}
	case *loraLinear:
		cp := *l
		cp.parts = slices.Clone(l.parts)
		for k := range cp.parts {
			d, u := *cp.parts[k].down, *cp.parts[k].up
			d.ghost, u.ghost = ghost, ghost
			cp.parts[k].down, cp.parts[k].up = &d, &u
		}
		return &cp
	case *residual:
		cp := *l
		cp.layers = make([]layer, len(l.layers))
		for j, inner := range l.layers {
			cp.layers[j] = withGhost(inner, ghost)
		}
		return &cp
	}
	return l
}

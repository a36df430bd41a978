package model

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// LoRA adds low-rank adapters to a linear layer on sequences (Hu et al.
// 2022, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3; for
// DP fine-tuning, Yu et al. 2022, "Differentially Private Fine-tuning of
// Language Models"): each part p of the layer's outputs, rows [Lo, Hi),
// gets y[Lo:Hi] += (Alpha/Rank)·B_p A_p x, with A_p [Rank, in] and B_p
// [Hi−Lo, Rank]. The layer's own weight and bias are frozen (a model with
// LoRA layers needs its frozen values, Model.WithFrozen); the adapters
// train unless the spec's Freeze patterns name them.
type LoRA struct {
	// Rank is r, the adapters' inner dimension: 1 to the smaller of the
	// layer's input and output widths.
	Rank int `json:"rank"`
	// Alpha sets the scale Alpha/Rank of the adapters' output; 0 means
	// Rank (a scale of 1).
	Alpha float64 `json:"alpha,omitempty"`
	// Parts are the output rows that get adapters, each with its own A
	// and B; none means one part over every output. A fused query, key
	// and value projection of width 3H adapts the query and the value
	// with parts [0, H) and [2H, 3H).
	Parts []LoRAPart `json:"parts,omitempty"`
}

// LoRAPart is one range of a LoRA layer's outputs and its adapters,
// named "<layer>.<Name>.lora_A" and "<layer>.<Name>.lora_B" ("lora_A",
// "lora_B" with no Name).
type LoRAPart struct {
	Name string `json:"name,omitempty"`
	Lo   int    `json:"lo"`
	Hi   int    `json:"hi"`
}

// loraLinear is a linear layer on a [T, D] sequence (seqLinear's 1×1
// convolution, base) with adapters. Its parameters in the full layout
// are the base's weight and bias (the frozen head, see leaf.head), then
// each part's A and B; theta holds only the adapters. Each adapter is a
// linear map at every position, so its per-example gradient, norm and
// bound are a 1×1 convolution's (conv.bound): A_p's with input x and
// output gradient s·B_pᵀ d[Lo:Hi], B_p's with input A_p x and output
// gradient s·d[Lo:Hi]; the layer's bound is the sum of its adapters'.
type loraLinear struct {
	base  *conv
	scale float32
	parts []loraPart
}

// loraPart is one part's adapters: down (A, D → r) and up (B, r → Hi−Lo),
// both without bias.
type loraPart struct {
	name     string
	lo, hi   int
	down, up *conv
}

// newLoRALinear builds the adapters of ls.LoRA around the linear layer
// base on a [T, D] input.
func newLoRALinear(ls LayerSpec, base *conv) (layer, error) {
	lr := ls.LoRA
	T, D, O := base.T, base.K, base.o
	if lr.Rank < 1 || lr.Rank > min(D, O) {
		return nil, fmt.Errorf("lora rank %d: need 1 to %d (the smaller of the input and output widths)", lr.Rank, min(D, O))
	}
	if !(lr.Alpha >= 0) || lr.Alpha > 1e6 {
		return nil, fmt.Errorf("lora alpha %v: need a number from 0 to 1e6", lr.Alpha)
	}
	if base.noBias {
		return nil, errors.New("lora on a linear layer without bias is not supported")
	}
	alpha := lr.Alpha
	if alpha == 0 {
		alpha = float64(lr.Rank)
	}
	parts := lr.Parts
	if len(parts) == 0 {
		parts = []LoRAPart{{Lo: 0, Hi: O}}
	}
	l := &loraLinear{base: base, scale: float32(alpha / float64(lr.Rank))}
	names := map[string]bool{}
	for i, p := range parts {
		if p.Lo < 0 || p.Hi > O || p.Lo >= p.Hi {
			return nil, fmt.Errorf("lora part %d: rows [%d, %d) not inside the %d outputs", i, p.Lo, p.Hi, O)
		}
		if i > 0 && p.Lo < parts[i-1].Hi {
			return nil, fmt.Errorf("lora part %d: rows [%d, %d) overlap or precede part %d's", i, p.Lo, p.Hi, i-1)
		}
		if names[p.Name] {
			return nil, fmt.Errorf("lora part %d: name %q used twice", i, p.Name)
		}
		names[p.Name] = true
		mk := func(in, out int) *conv {
			c := &conv{c: in, h: T, w: 1, o: out, k: 1, s: 1, ho: T, wo: 1, T: T, K: in, noBias: true}
			c.ghost = ghostCheaper(T, in, out)
			return c
		}
		l.parts = append(l.parts, loraPart{name: p.Name, lo: p.Lo, hi: p.Hi, down: mk(D, lr.Rank), up: mk(lr.Rank, p.Hi-p.Lo)})
	}
	return l, nil
}

func (l *loraLinear) outShape() []int { return []int{l.base.T, l.base.o} }

func (l *loraLinear) paramShapes() []paramShape {
	out := weightBias(l.base.o, []int{l.base.o, l.base.K}, false)
	for _, p := range l.parts {
		out = append(out, paramShape{p.prefix() + "lora_A", []int{p.down.o, p.down.K}},
			paramShape{p.prefix() + "lora_B", []int{p.up.o, p.up.K}})
	}
	return out
}

func (p loraPart) prefix() string {
	if p.name == "" {
		return ""
	}
	return p.name + "."
}

// headSize is the number of the base's parameters (weight and bias),
// which lead the layer's full layout and are frozen.
func (l *loraLinear) headSize() int { return l.base.o*l.base.K + l.base.o }

// init draws the base as a linear layer's, each A as PyTorch's and PEFT's
// default (uniform in ±1/√D, kaiming_uniform_ with a = √5) and B = 0, so
// the adapted layer starts as the base.
func (l *loraLinear) init(w []float32, rng *rand.Rand) {
	n := l.headSize()
	l.base.init(w[:n], rng)
	for _, p := range l.parts {
		a := p.down.o * p.down.K
		p.down.init(w[n:n+a], rng)
		n += a
		b := p.up.o * p.up.K
		clear(w[n : n+b])
		n += b
	}
}

// adapterSlices splits the adapters' values w (theta's part of the layer)
// into each part's A and B.
func (l *loraLinear) adapterSlices(w []float32, f func(i int, a, b []float32)) {
	n := 0
	for i, p := range l.parts {
		a, b := p.down.o*p.down.K, p.up.o*p.up.K
		f(i, w[n:n+a:n+a], w[n+a:n+a+b:n+a+b])
		n += a + b
	}
}

func (l *loraLinear) newState(maxB, workers int, needDin bool) layerState {
	st := &loraState{l: l, base: l.base.newState(maxB, workers, needDin).(*convState)}
	T := l.base.T
	for _, p := range l.parts {
		ps := loraPartState{
			down: p.down.newState(maxB, workers, needDin).(*convState),
			up:   p.up.newState(maxB, workers, true).(*convState),
			u:    make([]float32, maxB*T*p.down.o),
			v:    make([]float32, maxB*T*p.up.o),
			g:    make([]float32, maxB*T*p.up.o),
			du:   make([]float32, maxB*T*p.down.o),
		}
		if needDin {
			ps.dx = make([]float32, maxB*T*l.base.K)
		}
		st.parts = append(st.parts, ps)
	}
	return st
}

// loraState is a LoRA layer's kernels with one workspace's buffers: the
// base's and, per part, the adapters' states, A x (u), B A x (v), the
// output gradient of B (g = s·d[Lo:Hi]) and of A (du = Bᵀ g), and A's
// input gradient (dx). head is the base's frozen weight and bias (place).
type loraState struct {
	l     *loraLinear
	base  *convState
	head  []float32
	parts []loraPartState
}

type loraPartState struct {
	down, up        *convState
	u, v, g, du, dx []float32
}

// setHead gives the state the base's frozen weight and bias.
func (s *loraState) setHead(head []float32) { s.head = head }

func (s *loraState) forward(p *pass, w, in, out []float32) {
	l := s.l
	s.base.forward(p, s.head, in, out)
	O, T := l.base.o, l.base.T
	l.adapterSlices(w, func(i int, a, b []float32) {
		ps, part := &s.parts[i], l.parts[i]
		ps.down.forward(p, a, in, ps.u)
		ps.up.forward(p, b, ps.u, ps.v)
		n := part.hi - part.lo
		for r := 0; r < p.B*T; r++ {
			dst, src := out[r*O+part.lo:r*O+part.hi], ps.v[r*n:(r+1)*n]
			for j, v := range src {
				dst[j] += l.scale * v
			}
		}
	})
}

func (s *loraState) backward(p *pass, w, in, out, dout, din []float32) {
	l := s.l
	O, T := l.base.o, l.base.T
	if din != nil {
		s.base.backward(p, s.head, in, out, dout, din)
	}
	l.adapterSlices(w, func(i int, a, b []float32) {
		ps, part := &s.parts[i], l.parts[i]
		n := part.hi - part.lo
		for r := 0; r < p.B*T; r++ {
			src, dst := dout[r*O+part.lo:r*O+part.hi], ps.g[r*n:(r+1)*n]
			for j, v := range src {
				dst[j] = l.scale * v
			}
		}
		ps.up.backward(p, b, ps.u, ps.v, ps.g, ps.du)
		ps.down.backward(p, a, in, ps.u, ps.du, ps.dx)
		if din != nil {
			for k, v := range ps.dx[:p.B*T*l.base.K] {
				din[k] += v
			}
		}
	})
}

func (s *loraState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	for i := range s.l.parts {
		ps := &s.parts[i]
		ps.up.bound(p, ps.u, ps.v, ps.g, b)
		ps.down.bound(p, in, ps.u, ps.du, b)
	}
}

func (s *loraState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	s.l.adapterSlices(dw, func(i int, a, b []float32) {
		ps := &s.parts[i]
		ps.up.paramGrad(p, b, ps.u, ps.v, ps.g, alpha)
		ps.down.paramGrad(p, a, in, ps.u, ps.du, alpha)
	})
}

// accGrad scales each adapter's stored output gradients by the clip
// factors p.coef (clearing a dropped example's stored values) and adds
// its sum, as a residual block does for its nested layers: the factors
// the caller applied to the layer's own output gradient do not reach
// the copies g and du.
func (s *loraState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	l := s.l
	n := 0
	for i, part := range l.parts {
		ps := &s.parts[i]
		na, nb := part.down.o*part.down.K, part.up.o*part.up.K
		applyCoef(ps.up, p.coef[:p.B], ps.u, ps.g, l.base.T*part.up.o)
		ps.up.accGrad(p, acc[n+na:n+na+nb], dst[n+na:n+na+nb], ps.u, ps.v, ps.g)
		applyCoef(ps.down, p.coef[:p.B], in, ps.du, l.base.T*part.down.o)
		ps.down.accGrad(p, acc[n:n+na], dst[n:n+na], in, ps.u, ps.du)
		n += na + nb
	}
}

// clearExample does nothing: accGrad clears the adapters' values of a
// dropped example (cᵢ = 0) itself.
func (s *loraState) clearExample(i int, in, dout []float32) {}

// headUser is a layer state that reads frozen values of its own besides
// its part of theta: a LoRA layer's base weight and bias.
type headUser interface{ setHead(head []float32) }

// MergedSpec is the spec without its LoRA adapters, trainable and freeze
// patterns: the plain model that Merged's values are for, the
// architecture a checkpoint the run started from has.
func (m *Model) MergedSpec() Spec {
	s := m.Spec()
	s.Trainable, s.Freeze = nil, nil
	var strip func(ls []LayerSpec)
	strip = func(ls []LayerSpec) {
		for i := range ls {
			ls[i].LoRA = nil
			strip(ls[i].Layers)
		}
	}
	strip(s.Layers)
	return s
}

// Merged writes into dst the parameters of MergedSpec's model (its full
// layout) equivalent to theta: each LoRA layer's weight with its
// adapters folded in, W[Lo:Hi] + (Alpha/Rank)·B_p A_p (computed in
// float64, rounded once), every other value as Merge gives it. A model
// without LoRA layers writes what Merge does.
func (m *Model) Merged(dst, theta []float32) error {
	plain, err := New(m.MergedSpec())
	if err != nil {
		return err
	}
	if len(dst) != plain.numFull {
		return fmt.Errorf("%w: Merged dst has %d values, the merged model %d", ErrShape, len(dst), plain.numFull)
	}
	full := make([]float32, m.numFull)
	if err := m.Merge(full, theta); err != nil {
		return err
	}
	// The two layouts list the same tensors in the same order, the
	// adapters left out.
	src := map[string]ParamInfo{}
	for _, p := range m.full {
		src[p.Name] = p
	}
	for _, p := range plain.full {
		q := src[p.Name]
		copy(dst[p.Offset:p.Offset+p.Size], full[q.Offset:q.Offset+q.Size])
	}
	var fold func(ly layer, off, poff int)
	fold = func(ly layer, off, poff int) {
		switch ly := ly.(type) {
		case *residual:
			pr := plainLayerOffsets(ly)
			for j, nl := range ly.layers {
				fold(nl, off+ly.off[j], poff+pr[j])
			}
		case *loraLinear:
			D := ly.base.K
			n := off + ly.headSize()
			r := ly.parts[0].down.o
			s := float64(ly.scale)
			for _, part := range ly.parts {
				a := full[n : n+r*D]
				b := full[n+r*D : n+r*D+(part.hi-part.lo)*r]
				n += r*D + (part.hi-part.lo)*r
				for o := part.lo; o < part.hi; o++ {
					row := dst[poff+o*D : poff+(o+1)*D]
					w := full[off+o*D : off+(o+1)*D]
					for c := range row {
						acc := float64(w[c])
						for k := 0; k < r; k++ {
							acc += s * float64(b[(o-part.lo)*r+k]) * float64(a[k*D+c])
						}
						row[c] = float32(acc)
					}
				}
			}
		}
	}
	for l, ly := range m.layers {
		fold(ly, m.layerOff[l], plain.layerOff[l])
	}
	return nil
}

// plainLayerOffsets returns the offsets of a residual block's nested
// layers in the block's parameters with their adapters left out.
func plainLayerOffsets(r *residual) []int {
	out := make([]int, len(r.layers))
	n := 0
	for j, nl := range r.layers {
		out[j] = n
		if ll, ok := nl.(*loraLinear); ok {
			n += ll.headSize()
		} else {
			n += r.size[j]
		}
	}
	return out
}

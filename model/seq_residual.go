package model

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
)

// residual is y = x + f(x), f its nested layers in order (He et al. 2016,
// "Deep Residual Learning for Image Recognition"). Its parameters are its
// layers' in order, named "<block>.<layer>.<tensor>". Every nested layer
// keeps its own kernels and per-example bounds: the clip factors scale each
// nested layer's output gradient as the workspace scales a top-level
// layer's (applyCoef), since every per-example gradient is linear in the
// loss gradient.
type residual struct {
	shape  []int
	layers []layer
	names  []string // parameter name prefix of layer j
	off    []int    // offset of layer j's parameters in the block's
	size   []int
	n      int
}

// newResidual checks a residual spec against its input shape.
func newResidual(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if len(ls.Layers) == 0 {
		return nil, errors.New("residual needs nested layers")
	}
	r := &residual{shape: slices.Clone(in)}
	shape := slices.Clone(in)
	for j, s := range ls.Layers {
		l, err := buildLayer(-1, s, shape)
		if err != nil {
			return nil, fmt.Errorf("nested layer %d (%s) on input %v: %v", j, s.Type, shape, err)
		}
		n := 0
		for _, p := range l.paramShapes() {
			n += shapeSize(p.shape)
		}
		r.off = append(r.off, r.n)
		r.size = append(r.size, n)
		r.n += n
		r.layers = append(r.layers, l)
		shape = l.outShape()
		if shapeSize(shape) < 1 || r.n < 0 || r.n > maxElems {
			return nil, fmt.Errorf("nested layer %d (%s): output %v or parameters too large", j, s.Type, shape)
		}
	}
	if !slices.Equal(shape, in) {
		return nil, fmt.Errorf("nested layers output %v, want the input shape %v", shape, in)
	}
	for j, s := range ls.Layers {
		prefix := s.Name
		if prefix == "" {
			prefix = fmt.Sprint(j)
		}
		r.names = append(r.names, prefix)
	}
	return r, nil
}

func (r *residual) outShape() []int { return slices.Clone(r.shape) }
func (r *residual) paramShapes() []paramShape {
	var out []paramShape
	for j, l := range r.layers {
		for _, p := range l.paramShapes() {
			out = append(out, paramShape{r.names[j] + "." + p.name, p.shape})
		}
	}
	return out
}

// init initializes each nested layer from its own generator, seeded from
// rng and the layer's index.
func (r *residual) init(w []float32, rng *rand.Rand) {
	for j, l := range r.layers {
		l.init(r.params(w, j), rand.New(rand.NewPCG(rng.Uint64(), uint64(j))))
	}
}

// params returns layer j's slice of the block's parameters (or gradient).
func (r *residual) params(w []float32, j int) []float32 {
	return w[r.off[j] : r.off[j]+r.size[j] : r.off[j]+r.size[j]]
}

func (r *residual) newState(maxB, workers int, needDin bool) layerState {
	n := len(r.layers)
	st := &resState{r: r, states: make([]layerState, n), act: make([][]float32, n+1), grad: make([][]float32, n+1)}
	for j, l := range r.layers {
		size := maxB * shapeSize(l.outShape())
		st.act[j+1] = make([]float32, size)
		st.grad[j+1] = make([]float32, size)
		// Layer 0's input gradient is needed only if the block's is.
		st.states[j] = l.newState(maxB, workers, j > 0 || needDin)
	}
	if needDin {
		st.grad[0] = make([]float32, maxB*shapeSize(r.shape))
	}
	return st
}

// resState is a residual block's kernels with one workspace's buffers:
// act[j] is layer j's input (act[0] aliases the block's input), grad[j]
// the loss gradient with respect to it.
//
// rel[j] is nested layer j's offset in the block's part of theta (-1 when
// it is frozen, and then frozen[j] holds its values), and low the lowest
// nested layer that trains (len(layers) if none does): place sets them.
type resState struct {
	r         *residual
	states    []layerState
	act, grad [][]float32
	rel, size []int
	frozen    [][]float32
	low       int
}

// place resolves the nested layers' parameters of block l of model m:
// each one's offset in the block's part of theta, or its frozen values.
func (s *resState) place(m *Model, l int) {
	n := len(s.r.layers)
	s.rel, s.size, s.frozen, s.low = make([]int, n), make([]int, n), make([][]float32, n), n
	for j, lf := range m.leaves[l] {
		if hu, ok := s.states[j].(headUser); ok {
			hu.setHead(m.leafHead(lf))
		}
		s.size[j] = lf.trained()
		if lf.tau < 0 {
			s.rel[j] = -1
			s.frozen[j] = m.leafParams(nil, lf)
			continue
		}
		s.rel[j] = lf.tau - m.tauOff[l]
		if s.size[j] > 0 {
			s.low = min(s.low, j)
		}
	}
}

// params returns nested layer j's parameters given the block's part of
// theta: a slice of it, or its frozen values.
func (s *resState) params(w []float32, j int) []float32 {
	if s.rel[j] < 0 {
		return s.frozen[j]
	}
	o, n := s.rel[j], s.size[j]
	return w[o : o+n : o+n]
}

// trains reports whether nested layer j has parameters that train.
func (s *resState) trains(j int) bool { return s.rel[j] >= 0 && s.size[j] > 0 }

func (s *resState) forward(p *pass, w, in, out []float32) {
	r := s.r
	s.act[0] = in
	for j := range r.layers {
		s.states[j].forward(p, s.params(w, j), s.act[j], s.act[j+1])
	}
	f := s.act[len(r.layers)]
	n := p.B * shapeSize(r.shape)
	for k, v := range in[:n] {
		out[k] = v + f[k]
	}
}

func (s *resState) backward(p *pass, w, in, out, dout, din []float32) {
	r := s.r
	L := len(r.layers)
	n := p.B * shapeSize(r.shape)
	copy(s.grad[L][:n], dout[:n])
	// Without din, the loss gradient goes down only as far as the lowest
	// nested layer that trains.
	stop := 0
	if din == nil {
		stop = s.low
	}
	for j := L - 1; j >= stop; j-- {
		var dj []float32
		if j > stop || din != nil {
			dj = s.grad[j]
		}
		s.states[j].backward(p, s.params(w, j), s.act[j], s.act[j+1], s.grad[j+1], dj)
	}
	if din != nil {
		for k, v := range dout[:n] {
			din[k] = v + s.grad[0][k]
		}
	}
}

func (s *resState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	for j := range s.r.layers {
		if s.trains(j) {
			s.states[j].bound(p, s.act[j], s.act[j+1], s.grad[j+1], b)
		}
	}
}

func (s *resState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	for j := range s.r.layers {
		if s.trains(j) {
			s.states[j].paramGrad(p, s.params(dw, j), s.act[j], s.act[j+1], s.grad[j+1], alpha)
		}
	}
}

// accGrad scales each nested layer's stored output gradients by the clip
// factors p.coef (zeroing a dropped example's stored values) and adds its
// sum, as the workspace does for top-level layers.
func (s *resState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	r := s.r
	for j := range r.layers {
		if !s.trains(j) {
			continue
		}
		applyCoef(s.states[j], p.coef[:p.B], s.act[j], s.grad[j+1], shapeSize(r.layers[j].outShape()))
		o, n := s.rel[j], s.size[j]
		s.states[j].accGrad(p, acc[o:o+n], dst[o:o+n], s.act[j], s.act[j+1], s.grad[j+1])
	}
}

// clearExample does nothing: accGrad clears the nested layers' values of a
// dropped example (cᵢ = 0) itself.
func (s *resState) clearExample(i int, in, dout []float32) {}

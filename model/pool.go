package model

import "fmt"

// pool is max or average pooling without padding, on (H, W, C) layout.
type pool struct {
	noParams
	max                   bool
	c, h, w, k, s, ho, wo int
}

// newPool checks a maxpool or avgpool layer spec against its input shape.
func newPool(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "out", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if len(in) != 3 {
		return nil, fmt.Errorf("%s needs a [C, H, W] input", ls.Type)
	}
	if ls.Kernel < 1 || ls.Stride < 1 || ls.Kernel > in[1] || ls.Kernel > in[2] {
		return nil, fmt.Errorf("need 1 ≤ kernel ≤ H, W and stride ≥ 1 (got kernel %d stride %d)", ls.Kernel, ls.Stride)
	}
	return &pool{max: ls.Type == MaxPool, c: in[0], h: in[1], w: in[2], k: ls.Kernel, s: ls.Stride,
		ho: (in[1]-ls.Kernel)/ls.Stride + 1, wo: (in[2]-ls.Kernel)/ls.Stride + 1}, nil
}

func (l *pool) outShape() []int { return []int{l.c, l.ho, l.wo} }

// poolState is a pooling layer's kernels with one workspace's buffers:
// for max pooling, the input index of each output's maximum.
type poolState struct {
	noParams
	l   *pool
	arg []int32 // nil for average pooling
}

func (l *pool) newState(maxB, workers int, needDin bool) layerState {
	if l.max {
		return &poolState{l: l, arg: make([]int32, maxB*l.c*l.ho*l.wo)}
	}
	return &poolState{l: l}
}

func (s *poolState) forward(p *pass, w, in, out []float32) {
	l := s.l
	nin, nout := l.h*l.w*l.c, l.ho*l.wo*l.c
	p.parFor(p.B, nout*l.k*l.k, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			x, y := in[i*nin:(i+1)*nin], out[i*nout:(i+1)*nout]
			if l.max {
				l.maxForward(y, s.arg[i*nout:(i+1)*nout], x)
			} else {
				l.avgForward(y, x)
			}
		}
	})
}

// rowOffsets returns where output row oh starts in y and where its window
// element (kh, kw) for ow = 0 starts in x: y[yo+ow·c+ch] pairs with
// x[xo+ow·s·c+ch], so the inner loops run over whole output rows.
func (l *pool) rowOffsets(oh, kh, kw int) (yo, xo int) {
	return oh * l.wo * l.c, ((oh*l.s+kh)*l.w + kw) * l.c
}

// maxForward takes window maxima and records in arg the input index of
// each maximum (the first in kh, kw order). The conditional updates are
// written as selects so the compiler can emit conditional moves: with random
// data the comparison is unpredictable.
func (l *pool) maxForward(y []float32, arg []int32, x []float32) {
	rowLen, c, step := l.wo*l.c, l.c, l.s*l.c
	for oh := 0; oh < l.ho; oh++ {
		for kh := 0; kh < l.k; kh++ {
			for kw := 0; kw < l.k; kw++ {
				yo, xo := l.rowOffsets(oh, kh, kw)
				yr, ar := y[yo:yo+rowLen], arg[yo:yo+rowLen]
				first := kh == 0 && kw == 0
				for ow := 0; ow < l.wo; ow++ {
					xb := xo + ow*step
					xs := x[xb : xb+c]
					ys, as := yr[ow*c:(ow+1)*c], ar[ow*c:(ow+1)*c]
					if first {
						copy(ys, xs)
						for ch := range as {
							as[ch] = int32(xb + ch)
						}
						continue
					}
					for ch, v := range xs {
						cur, a := ys[ch], as[ch]
						if v > cur {
							a = int32(xb + ch)
						}
						as[ch] = a
						ys[ch] = max(cur, v)
					}
				}
			}
		}
	}
}

func (l *pool) avgForward(y, x []float32) {
	rowLen, c, step := l.wo*l.c, l.c, l.s*l.c
	inv := 1 / float32(l.k*l.k)
	clear(y)
	for oh := 0; oh < l.ho; oh++ {
		for kh := 0; kh < l.k; kh++ {
			for kw := 0; kw < l.k; kw++ {
				yo, xo := l.rowOffsets(oh, kh, kw)
				yr := y[yo : yo+rowLen]
				for ow := 0; ow < l.wo; ow++ {
					xs := x[xo+ow*step : xo+ow*step+c]
					ys := yr[ow*c : (ow+1)*c]
					for ch, v := range xs {
						ys[ch] += v
					}
				}
			}
		}
	}
	for j := range y {
		y[j] *= inv
	}
}

func (s *poolState) backward(p *pass, w, in, out, dout, din []float32) {
	l := s.l
	if din == nil {
		return
	}
	nin, nout := l.h*l.w*l.c, l.ho*l.wo*l.c
	inv := 1 / float32(l.k*l.k)
	p.parFor(p.B, nout*l.k*l.k, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			dx, dy := din[i*nin:(i+1)*nin], dout[i*nout:(i+1)*nout]
			clear(dx)
			if l.max {
				for o, a := range s.arg[i*nout : (i+1)*nout] {
					dx[a] += dy[o]
				}
				continue
			}
			rowLen, c, step := l.wo*l.c, l.c, l.s*l.c
			for oh := 0; oh < l.ho; oh++ {
				for kh := 0; kh < l.k; kh++ {
					for kw := 0; kw < l.k; kw++ {
						yo, xo := l.rowOffsets(oh, kh, kw)
						yr := dy[yo : yo+rowLen]
						for ow := 0; ow < l.wo; ow++ {
							xs := dx[xo+ow*step : xo+ow*step+c]
							for ch, g := range yr[ow*c : (ow+1)*c] {
								xs[ch] += g * inv
							}
						}
					}
				}
			}
		}
	})
}

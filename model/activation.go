package model

import (
	"math"
	"slices"
)

// activation is an elementwise nonlinearity: ReLU, tanh, or GELU in its
// erf form (gelu) or its tanh approximation (gelu_tanh).
//
// GELU (Hendrycks and Gimpel 2016, "Gaussian Error Linear Units") is
// y = x·Φ(x) with Φ the standard normal CDF; gelu_tanh replaces Φ(x) by
// ½(1 + tanh(√(2/π)(x + 0.044715x³))), as GPT-2 does. Both, and their
// derivatives, are evaluated in float64 from the float32 input (for every
// finite float32 x, x² and x³ are far inside the float64 range) and
// rounded once to float32. The float64 evaluation errs by a few float64
// ulps of its terms, amplified by the tails' conditioning (about 2x², at
// most a few hundred where the float32 result is neither 0 nor x), so
// well below 1e-12 relative: the float32 results are within one rounding
// (u32 = 2⁻²⁴ relative, 2⁻¹⁵⁰ where subnormal) plus that of the exact
// function of the stored input (TestGELUAccuracy). No clip bound depends
// on them: the bounds read the stored activations and output gradients,
// whatever computed them (ClippedSum). The backward pass of GELU reads
// the layer's input, which the workspace keeps (GELU is not monotonic, so
// its output does not determine x).
type activation struct {
	noParams
	kind  string // ReLU, Tanh, GELU or GELUTanh
	shape []int
	n     int
}

// newActivation checks a relu, tanh, gelu or gelu_tanh layer spec.
func newActivation(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	return &activation{kind: ls.Type, shape: slices.Clone(in), n: shapeSize(in)}, nil
}

func (a *activation) outShape() []int                                     { return slices.Clone(a.shape) }
func (a *activation) newState(maxB, workers int, needDin bool) layerState { return a }

func (a *activation) forward(p *pass, w, in, out []float32) {
	p.parFor(p.B, a.n*8, func(_, lo, hi int) {
		x, y := in[lo*a.n:hi*a.n], out[lo*a.n:hi*a.n]
		switch a.kind {
		case Tanh:
			for j, v := range x {
				y[j] = tanh32(v)
			}
		case GELU:
			for j, v := range x {
				y[j] = float32(float64(v) * normCDF(float64(v)))
			}
		case GELUTanh:
			for j, v := range x {
				y[j] = float32(float64(v) * geluTanhGate(float64(v)))
			}
		default:
			for j, v := range x {
				y[j] = max(v, 0)
			}
		}
	})
}

func (a *activation) backward(p *pass, w, in, out, dout, din []float32) {
	if din == nil {
		return
	}
	p.parFor(p.B, a.n, func(_, lo, hi int) {
		x, y, dy, dx := in[lo*a.n:hi*a.n], out[lo*a.n:hi*a.n], dout[lo*a.n:hi*a.n], din[lo*a.n:hi*a.n]
		switch a.kind {
		case Tanh:
			for j, v := range y {
				dx[j] = dy[j] * (1 - v*v)
			}
		case GELU:
			for j, v := range x {
				dx[j] = float32(float64(dy[j]) * geluDeriv(float64(v)))
			}
		case GELUTanh:
			for j, v := range x {
				dx[j] = float32(float64(dy[j]) * geluTanhDeriv(float64(v)))
			}
		default:
			for j, v := range y {
				if v > 0 {
					dx[j] = dy[j]
				} else {
					dx[j] = 0
				}
			}
		}
	})
}

// normCDF is Φ(x) = ½·erfc(−x/√2), which keeps its relative accuracy in
// the lower tail where 1 + erf(x/√2) would cancel.
func normCDF(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }

// geluDeriv is d/dx x·Φ(x) = Φ(x) + x·φ(x), φ the standard normal density.
func geluDeriv(x float64) float64 {
	return normCDF(x) + x*math.Exp(-0.5*x*x)/math.Sqrt(2*math.Pi)
}

// geluTanhArg returns u = √(2/π)(x + 0.044715x³) and du/dx.
func geluTanhArg(x float64) (u, du float64) {
	const c, k = 0.044715, 0.7978845608028654 // √(2/π)
	return k * (x + c*x*x*x), k * (1 + 3*c*x*x)
}

// geluTanhGate is ½(1 + tanh(u)), written as the logistic function
// 1/(1 + e^{−2u}), which keeps its relative accuracy where tanh(u) is
// near −1.
func geluTanhGate(x float64) float64 {
	u, _ := geluTanhArg(x)
	return 1 / (1 + math.Exp(-2*u))
}

// geluTanhDeriv is d/dx x·s(x), s = geluTanhGate: s + x·2s(1−s)·du/dx
// (since d/du ½(1 + tanh u) = ½(1 − tanh²u) = 2s(1−s)).
func geluTanhDeriv(x float64) float64 {
	_, du := geluTanhArg(x)
	s := geluTanhGate(x)
	return s + 2*x*s*(1-s)*du
}

// flatten turns the internal (H, W, C) layout into C, H, W order.
type flatten struct {
	noParams
	n, c, hw int
}

// newFlatten checks a flatten layer spec.
func newFlatten(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	f := &flatten{n: shapeSize(in), c: 1, hw: shapeSize(in)}
	if len(in) == 3 {
		f.c, f.hw = in[0], in[1]*in[2]
	}
	return f, nil
}

func (f *flatten) outShape() []int                                     { return []int{f.n} }
func (f *flatten) newState(maxB, workers int, needDin bool) layerState { return f }

func (f *flatten) forward(p *pass, w, in, out []float32) {
	if f.c == 1 {
		copy(out[:p.B*f.n], in[:p.B*f.n])
		return
	}
	for i := 0; i < p.B; i++ {
		x, y := in[i*f.n:(i+1)*f.n], out[i*f.n:(i+1)*f.n]
		for s := 0; s < f.hw; s++ {
			for c := 0; c < f.c; c++ {
				y[c*f.hw+s] = x[s*f.c+c]
			}
		}
	}
}

func (f *flatten) backward(p *pass, w, in, out, dout, din []float32) {
	if din == nil {
		return
	}
	if f.c == 1 {
		copy(din[:p.B*f.n], dout[:p.B*f.n])
		return
	}
	for i := 0; i < p.B; i++ {
		dy, dx := dout[i*f.n:(i+1)*f.n], din[i*f.n:(i+1)*f.n]
		for s := 0; s < f.hw; s++ {
			for c := 0; c < f.c; c++ {
				dx[s*f.c+c] = dy[c*f.hw+s]
			}
		}
	}
}

// tanh32 is a float32 tanh: the clamped rational approximation of Eigen's
// generic_fast_tanh_float (Eigen, MathFunctionsImpl.h; a 13/6-degree
// minimax rational function), accurate to a few float32 ulps; it is several
// times faster than math.Tanh in float64. TestTanh32 checks it against
// math.Tanh.
func tanh32(x float32) float32 {
	const clamp = 7.90531110763549805
	if x > clamp {
		x = clamp
	} else if x < -clamp {
		x = -clamp
	}
	if x < 0.0004 && x > -0.0004 {
		return x
	}
	const (
		a1  = 4.89352455891786e-03
		a3  = 6.37261928875436e-04
		a5  = 1.48572235717979e-05
		a7  = 5.12229709037114e-08
		a9  = -8.60467152213735e-11
		a11 = 2.00018790482477e-13
		a13 = -2.76076847742355e-16
		b0  = 4.89352518554385e-03
		b2  = 2.26843463243900e-03
		b4  = 1.18534705686654e-04
		b6  = 1.19825839466702e-06
	)
	x2 := x * x
	p := x * (a1 + x2*(a3+x2*(a5+x2*(a7+x2*(a9+x2*(a11+x2*a13))))))
	q := b0 + x2*(b2+x2*(b4+x2*b6))
	return p / q
}

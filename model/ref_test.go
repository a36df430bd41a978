package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// This file holds an independent float64 reference of every layer, written
// as direct loops in PyTorch's [C, H, W] layout (no im2col, no channels-last,
// no BLAS), used for finite-difference checks of the float32 backward passes.

// refLoss returns the mean softmax cross-entropy of the model at theta
// (float64) on the batch.
func refLoss(t testing.TB, m *Model, theta []float64, x []float32, y []int32) float64 {
	t.Helper()
	if m.seqT > 0 {
		return refNextTokenLoss(t, m, theta, x)
	}
	d := m.InputSize()
	var total float64
	for i := range y {
		z := refForward(t, m, theta, x[i*d:(i+1)*d])
		mx := math.Inf(-1)
		for _, v := range z {
			mx = math.Max(mx, v)
		}
		var se float64
		for _, v := range z {
			se += math.Exp(v - mx)
		}
		total += mx + math.Log(se) - z[y[i]]
	}
	return total / float64(len(y))
}

// refForward runs one example through the reference layers.
func refForward(t testing.TB, m *Model, theta []float64, x32 []float32) []float64 {
	t.Helper()
	x := make([]float64, len(x32))
	for i, v := range x32 {
		x[i] = float64(v)
	}
	shape := m.InputShape()
	if m.seqT > 0 {
		x, shape = x[:m.seqT], []int{m.seqT}
	}
	ids := slices.Clone(x) // the input token ids, for the layers that look for padding
	for li, ls := range m.spec.Layers {
		w := theta[m.layerOff[li] : m.layerOff[li]+m.layerSize[li]]
		x, shape = refLayer(t, m.layers[li], ls, w, x, shape, ids)
	}
	return x
}

// refLayer applies one layer (ly, built from ls) with parameters w to one
// example's values x of the given shape; ids is the example's model input.
func refLayer(t testing.TB, ly layer, ls LayerSpec, w, x []float64, shape []int, ids []float64) ([]float64, []int) {
	if y, sh, ok := refSeqLayer(t, ly, ls, w, x, shape, ids); ok {
		return y, sh
	}
	switch ls.Type {
	case Linear:
		in, out := shape[0], ls.Out
		y := make([]float64, out)
		for o := 0; o < out; o++ {
			s := refBias(ls, w, out*in+o)
			for j := 0; j < in; j++ {
				s += w[o*in+j] * x[j]
			}
			y[o] = s
		}
		x, shape = y, []int{out}
	case ReLU:
		for j := range x {
			x[j] = math.Max(x[j], 0)
		}
	case Tanh:
		for j := range x {
			x[j] = math.Tanh(x[j])
		}
	case GELU:
		for j, v := range x {
			x[j] = 0.5 * v * (1 + math.Erf(v/math.Sqrt2))
		}
	case GELUTanh:
		for j, v := range x {
			x[j] = 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
		}
	case Flatten:
		shape = []int{len(x)}
	case Conv2D:
		c, h, wd := shape[0], shape[1], shape[2]
		k, s, p, o := ls.Kernel, ls.Stride, ls.Pad, ls.Out
		ho, wo := (h+2*p-k)/s+1, (wd+2*p-k)/s+1
		y := make([]float64, o*ho*wo)
		for oc := 0; oc < o; oc++ {
			for oh := 0; oh < ho; oh++ {
				for ow := 0; ow < wo; ow++ {
					sum := w[o*c*k*k+oc]
					for ic := 0; ic < c; ic++ {
						for kh := 0; kh < k; kh++ {
							for kw := 0; kw < k; kw++ {
								hh, ww := oh*s-p+kh, ow*s-p+kw
								if hh < 0 || hh >= h || ww < 0 || ww >= wd {
									continue
								}
								sum += w[((oc*c+ic)*k+kh)*k+kw] * x[(ic*h+hh)*wd+ww]
							}
						}
					}
					y[(oc*ho+oh)*wo+ow] = sum
				}
			}
		}
		x, shape = y, []int{o, ho, wo}
	case MaxPool, AvgPool:
		c, h, wd := shape[0], shape[1], shape[2]
		k, s := ls.Kernel, ls.Stride
		ho, wo := (h-k)/s+1, (wd-k)/s+1
		y := make([]float64, c*ho*wo)
		for ic := 0; ic < c; ic++ {
			for oh := 0; oh < ho; oh++ {
				for ow := 0; ow < wo; ow++ {
					best, sum := math.Inf(-1), 0.0
					for kh := 0; kh < k; kh++ {
						for kw := 0; kw < k; kw++ {
							v := x[(ic*h+oh*s+kh)*wd+ow*s+kw]
							best = math.Max(best, v)
							sum += v
						}
					}
					if ls.Type == MaxPool {
						y[(ic*ho+oh)*wo+ow] = best
					} else {
						y[(ic*ho+oh)*wo+ow] = sum / float64(k*k)
					}
				}
			}
		}
		x, shape = y, []int{c, ho, wo}
	case EmbeddingBag:
		y := make([]float64, ls.Dim)
		n := 0
		for _, tok := range x {
			if tok < 0 {
				continue
			}
			n++
			for j := range y {
				y[j] += w[int(tok)*ls.Dim+j]
			}
		}
		if n > 0 {
			for j := range y {
				y[j] /= float64(n)
			}
		}
		x, shape = y, []int{ls.Dim}
	case LayerNorm:
		f := len(x)
		var mu, vr float64
		for _, v := range x {
			mu += v
		}
		mu /= float64(f)
		for _, v := range x {
			vr += (v - mu) * (v - mu)
		}
		vr /= float64(f)
		r := 1 / math.Sqrt(vr+ls.Eps)
		for j := range x {
			x[j] = (x[j]-mu)*r*w[j] + w[f+j]
		}
	default:
		t.Fatalf("reference: unknown layer %q", ls.Type)
	}
	return x, shape
}

// refBias returns a linear layer's bias w[j], or 0 for one without a bias.
func refBias(ls LayerSpec, w []float64, j int) float64 {
	if ls.NoBias {
		return 0
	}
	return w[j]
}

// randomBatch draws B inputs and labels for m: N(0,1) features, or token
// ids in [-1, vocab) for embedding models.
func randomBatch(m *Model, B int, rng *rand.Rand) ([]float32, []int32) {
	d := m.InputSize()
	x := make([]float32, B*d)
	y := make([]int32, B)
	for i := range x {
		if m.vocab > 0 {
			x[i] = float32(rng.IntN(m.vocab+1) - 1)
		} else {
			x[i] = float32(rng.NormFloat64())
		}
	}
	for i := range y {
		y[i] = int32(rng.IntN(m.Classes()))
	}
	return x, y
}

// randomTheta is Init(seed) plus N(0, 0.3²) noise, so biases and layer-norm
// gains are not at their special initial values.
func randomTheta(t testing.TB, m *Model, seed uint64) []float32 {
	t.Helper()
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, seed); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	for i := range theta {
		theta[i] += float32(0.3 * rng.NormFloat64())
	}
	return theta
}

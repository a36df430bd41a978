package model

import (
	"fmt"
	"math"
	"runtime"

	"github.com/dpcluster/dpcluster/dataset"
)

// Workspace owns every buffer a forward/backward pass needs for batches of
// up to MaxBatch examples, so computing gradients allocates nothing that
// grows with the batch or the model (the goroutines that split work over
// GOMAXPROCS cost a few small allocations per layer). A Workspace is not safe
// for concurrent use; create one per goroutine. Results are deterministic:
// the same (theta, x, y) give the same bits whatever GOMAXPROCS is at call
// time, since work is split per example and every reduction runs in a fixed
// order.
type Workspace struct {
	m       *Model
	maxB    int
	workers int
	act     [][]float32 // act[0] = input (internal layout), act[l+1] = output of layer l
	grad    [][]float32 // grad[l] = ∂loss/∂act[l]; nil where never needed
	needDin []bool      // layer l must produce grad[l]
	states  []any
	norms   []float64
	// naive reference buffers, allocated on first use
	naiveG   []float32
	naiveAcc []float64
	// ClippedSumIndexed buffers, allocated on first use
	gx   []float32
	gy   []int32
	part []float32
}

// clipShade is the relative margin under the clip norm (see ClippedSum).
const clipShade = 1 - 1.0/(1<<16)

// Metrics are a loss and accuracy over a set of examples.
type Metrics struct {
	// Loss is the mean softmax cross-entropy (natural log).
	Loss float64
	// Accuracy is the fraction of examples whose arg-max logit is the label.
	Accuracy float64
	// N is the number of examples.
	N int
}

// NewWorkspace allocates buffers for batches of up to maxBatch examples.
func (m *Model) NewWorkspace(maxBatch int) (*Workspace, error) {
	if maxBatch < 1 {
		return nil, fmt.Errorf("%w: max batch %d < 1", ErrShape, maxBatch)
	}
	workers := min(runtime.GOMAXPROCS(0), 8)
	L := len(m.layers)
	w := &Workspace{m: m, maxB: maxBatch, workers: workers,
		act: make([][]float32, L+1), grad: make([][]float32, L+1),
		needDin: make([]bool, L), states: make([]any, L), norms: make([]float64, maxBatch)}
	w.act[0] = make([]float32, maxBatch*m.inSize)
	paramBelow := false
	for l, ly := range m.layers {
		w.needDin[l] = paramBelow
		if m.layerSize[l] > 0 {
			paramBelow = true
		}
		n := maxBatch * shapeSize(ly.outShape())
		w.act[l+1] = make([]float32, n)
		w.grad[l+1] = make([]float32, n)
		w.states[l] = ly.newState(maxBatch, workers, w.needDin[l])
	}
	return w, nil
}

// MaxBatch returns the largest batch the workspace accepts.
func (w *Workspace) MaxBatch() int { return w.maxB }

// Model returns the model the workspace computes for.
func (w *Workspace) Model() *Model { return w.m }

// check validates one call's arguments: lengths, labels and token ids.
func (w *Workspace) check(dst, theta, x []float32, y []int32) error {
	m := w.m
	if len(theta) != m.numParams {
		return fmt.Errorf("%w: theta has %d values, model has %d parameters", ErrShape, len(theta), m.numParams)
	}
	if dst != nil && len(dst) != m.numParams {
		return fmt.Errorf("%w: dst has %d values, model has %d parameters", ErrShape, len(dst), m.numParams)
	}
	B := len(y)
	if B > w.maxB {
		return fmt.Errorf("%w: batch of %d exceeds the workspace's max batch %d", ErrShape, B, w.maxB)
	}
	if len(x) != B*m.inSize {
		return fmt.Errorf("%w: x has %d values, want %d examples × %d", ErrShape, len(x), B, m.inSize)
	}
	for i, c := range y {
		if c < 0 || int(c) >= m.classes {
			return fmt.Errorf("%w: example %d: label %d outside [0, %d)", ErrShape, i, c, m.classes)
		}
	}
	if m.vocab > 0 {
		for j, t := range x {
			if !(t >= -1 && t < float32(m.vocab)) || t != float32(math.Trunc(float64(t))) {
				return fmt.Errorf("%w: example %d: token %v not an integer in [-1, %d)", ErrShape, j/m.inSize, t, m.vocab)
			}
		}
	}
	return nil
}

func (w *Workspace) pass(B int) *pass {
	return &pass{be: w.m.backend, B: B, workers: w.workers}
}

// forward loads x into the internal layout and runs every layer.
func (w *Workspace) forward(p *pass, theta, x []float32) {
	m := w.m
	in := w.act[0]
	if len(m.inShape) == 3 && m.inShape[0] > 1 {
		c, hw := m.inShape[0], m.inShape[1]*m.inShape[2]
		for i := 0; i < p.B; i++ {
			src, dst := x[i*m.inSize:(i+1)*m.inSize], in[i*m.inSize:(i+1)*m.inSize]
			for ch := 0; ch < c; ch++ {
				for s := 0; s < hw; s++ {
					dst[s*c+ch] = src[ch*hw+s]
				}
			}
		}
	} else {
		copy(in, x)
	}
	for l, ly := range m.layers {
		ly.forward(p, w.layerParams(theta, l), w.act[l], w.act[l+1], w.states[l])
	}
}

func (w *Workspace) layerParams(theta []float32, l int) []float32 {
	off, n := w.m.layerOff[l], w.m.layerSize[l]
	return theta[off : off+n : off+n]
}

// backward propagates grad[L] down to every layer that needs it.
func (w *Workspace) backward(p *pass, theta []float32) {
	for l := len(w.m.layers) - 1; l >= 0; l-- {
		var din []float32
		if w.needDin[l] {
			din = w.grad[l]
		}
		w.m.layers[l].backward(p, w.layerParams(theta, l), w.act[l], w.act[l+1], w.grad[l+1], din, w.states[l])
	}
}

// paramGrads writes every parameter layer's gradient (alpha · Σ over the
// batch of the current grad buffers) into dst.
func (w *Workspace) paramGrads(p *pass, dst []float32, alpha float32) {
	for l, ly := range w.m.layers {
		if w.m.layerSize[l] == 0 {
			continue
		}
		ly.paramGrad(p, w.layerParams(dst, l), w.act[l], w.act[l+1], w.grad[l+1], alpha, w.states[l])
	}
}

// softmaxXent computes the summed softmax cross-entropy of the logits in
// act[L] and, if dlogits is non-nil, writes scale·(softmax − onehot(y)) to
// it. It returns the loss sum (float64, log-sum-exp with the max
// subtracted) and the number of correct arg-max predictions.
func (w *Workspace) softmaxXent(B int, y []int32, dlogits []float32, scale float32) (float64, int) {
	k := w.m.classes
	logits := w.act[len(w.m.layers)]
	var loss float64
	correct := 0
	for i := 0; i < B; i++ {
		z := logits[i*k : (i+1)*k]
		arg := 0
		for j, v := range z {
			if v > z[arg] {
				arg = j
			}
		}
		if arg == int(y[i]) {
			correct++
		}
		mx := float64(z[arg])
		var se float64
		for _, v := range z {
			se += math.Exp(float64(v) - mx)
		}
		lse := mx + math.Log(se)
		loss += lse - float64(z[y[i]])
		if dlogits != nil {
			d := dlogits[i*k : (i+1)*k]
			for j, v := range z {
				pj := math.Exp(float64(v) - lse)
				if j == int(y[i]) {
					pj--
				}
				d[j] = scale * float32(pj)
			}
		}
	}
	return loss, correct
}

// MeanGrad writes the non-private mean gradient of the softmax
// cross-entropy over the batch (x holds len(y) examples) into dst and
// returns the mean loss. It is the baseline the clipped sum is compared
// with, and what per-example references are built from. Errors: ErrShape
// (wrong lengths, empty batch, bad labels or tokens), ErrNonFinite.
func (w *Workspace) MeanGrad(dst, theta, x []float32, y []int32) (float64, error) {
	if dst == nil {
		return 0, fmt.Errorf("%w: nil dst", ErrShape)
	}
	if err := w.check(dst, theta, x, y); err != nil {
		return 0, err
	}
	B := len(y)
	if B == 0 {
		return 0, fmt.Errorf("%w: empty batch has no mean gradient", ErrShape)
	}
	p := w.pass(B)
	w.forward(p, theta, x)
	loss, _ := w.softmaxXent(B, y, w.grad[len(w.m.layers)], 1/float32(B))
	w.backward(p, theta)
	w.paramGrads(p, dst, 1)
	loss /= float64(B)
	if math.IsNaN(loss) || math.IsInf(loss, 0) || !allFinite(dst) {
		return 0, fmt.Errorf("%w: in the mean gradient", ErrNonFinite)
	}
	return loss, nil
}

// ClippedSum writes into dst the sum over the batch of per-example
// gradients of the softmax cross-entropy, each clipped to L2 norm clip over
// all parameters (flat clipping: gᵢ·min(1, clip/‖gᵢ‖); Abadi et al. 2016,
// "Deep Learning with Differential Privacy"), and returns the batch size.
// An empty batch writes zeros. dst must not alias theta.
//
// It never materializes the B per-example gradients: one forward and one
// backward pass store every layer's input and output gradient; per-example
// norms come from ghost norms (linear, embedding, and convolutions where
// cheaper) or small per-example products (other convolutions, layer norm);
// then, since every layer's per-example gradient is linear in its output
// gradient δᵢ, the stored δᵢ are rescaled by cᵢ = min(1, clip/‖gᵢ‖) and the
// parameter gradients are formed once, as in a non-private step
// ("book-keeping", Bu, Wang, Zha and Karypis 2023, "Differentially Private
// Optimization on Large Model at Small Cost", Alg. 1; ghost clipping, Li,
// Tramèr, Liang and Hashimoto 2022).
//
// Examples are clipped to C' = C·(1−2⁻¹⁶) rather than exactly C: the norms
// are computed in float32 arithmetic (relative error ~1e-6), and the margin
// keeps every contribution, and so ‖sum‖ ≤ count·C, strictly within the
// sensitivity the accountant assumes and the coordinator checks.
//
// Errors: ErrShape, ErrBadClip, ErrNonFinite (dst then holds unspecified
// values).
func (w *Workspace) ClippedSum(dst, theta, x []float32, y []int32, clip float64) (int, error) {
	if dst == nil {
		return 0, fmt.Errorf("%w: nil dst", ErrShape)
	}
	if !(clip > 0) || math.IsInf(clip, 0) {
		return 0, fmt.Errorf("%w: got %v", ErrBadClip, clip)
	}
	if err := w.check(dst, theta, x, y); err != nil {
		return 0, err
	}
	B := len(y)
	if B == 0 {
		clear(dst)
		return 0, nil
	}
	p := w.pass(B)
	w.forward(p, theta, x)
	L := len(w.m.layers)
	w.softmaxXent(B, y, w.grad[L], 1)
	w.backward(p, theta)
	norms := w.norms[:B]
	clear(norms)
	for l, ly := range w.m.layers {
		if w.m.layerSize[l] > 0 {
			ly.sqNorms(p, w.act[l], w.act[l+1], w.grad[l+1], norms, w.states[l])
		}
	}
	for i, n := range norms {
		if math.IsNaN(n) || math.IsInf(n, 0) {
			return 0, fmt.Errorf("%w: example %d's gradient norm is %v", ErrNonFinite, i, n)
		}
		// Reuse norms[i] to hold cᵢ = min(1, C'/‖gᵢ‖).
		norms[i] = 1
		if g := math.Sqrt(n); g > clip*clipShade {
			norms[i] = clip * clipShade / g
		}
	}
	for l, ly := range w.m.layers {
		if w.m.layerSize[l] == 0 {
			continue
		}
		d := w.grad[l+1]
		per := len(d) / w.maxB
		for i, c := range norms {
			if c == 1 {
				continue
			}
			cf := float32(c)
			row := d[i*per : (i+1)*per]
			for j := range row {
				row[j] *= cf
			}
		}
		ly.paramGrad(p, w.layerParams(dst, l), w.act[l], w.act[l+1], d, 1, w.states[l])
	}
	if !allFinite(dst) {
		return 0, fmt.Errorf("%w: in the clipped sum", ErrNonFinite)
	}
	return B, nil
}

// ClippedSumIndexed is ClippedSum over the rows idx of d (a Poisson batch
// drawn by package sampling, say), of any length: rows are gathered into
// workspace buffers MaxBatch at a time and the chunks' clipped sums are
// added in order (float32). It returns len(idx). The first call allocates
// a batch buffer and a parameter-sized buffer. Errors: those of ClippedSum
// and CheckDataset, and ErrShape for an index outside [0, d.Len()).
func (w *Workspace) ClippedSumIndexed(dst, theta []float32, d *dataset.Dataset, idx []int, clip float64) (int, error) {
	if err := w.m.CheckDataset(d); err != nil {
		return 0, err
	}
	for _, i := range idx {
		if i < 0 || i >= d.Len() {
			return 0, fmt.Errorf("%w: index %d outside dataset %q of %d rows", ErrShape, i, d.Name, d.Len())
		}
	}
	if w.gx == nil {
		w.gx = make([]float32, w.maxB*w.m.inSize)
		w.gy = make([]int32, w.maxB)
	}
	if len(idx) <= w.maxB {
		d.Gather(w.gx, w.gy, idx)
		return w.ClippedSum(dst, theta, w.gx[:len(idx)*w.m.inSize], w.gy[:len(idx)], clip)
	}
	if w.part == nil {
		w.part = make([]float32, w.m.numParams)
	}
	for lo := 0; lo < len(idx); lo += w.maxB {
		chunk := idx[lo:min(lo+w.maxB, len(idx))]
		d.Gather(w.gx, w.gy, chunk)
		out := dst
		if lo > 0 {
			out = w.part
		}
		if _, err := w.ClippedSum(out, theta, w.gx[:len(chunk)*w.m.inSize], w.gy[:len(chunk)], clip); err != nil {
			return 0, err
		}
		if lo > 0 {
			for j, v := range w.part {
				dst[j] += v
			}
		}
	}
	return len(idx), nil
}

// ClippedSumNaive computes the same result as ClippedSum the slow way, as a
// reference: it materializes each example's gradient with a batch-of-one
// backward pass, clips it in float64 and accumulates in float64. It
// allocates two parameter-sized buffers on first use.
func (w *Workspace) ClippedSumNaive(dst, theta, x []float32, y []int32, clip float64) (int, error) {
	if dst == nil {
		return 0, fmt.Errorf("%w: nil dst", ErrShape)
	}
	if !(clip > 0) || math.IsInf(clip, 0) {
		return 0, fmt.Errorf("%w: got %v", ErrBadClip, clip)
	}
	if err := w.check(dst, theta, x, y); err != nil {
		return 0, err
	}
	if w.naiveG == nil {
		w.naiveG = make([]float32, w.m.numParams)
		w.naiveAcc = make([]float64, w.m.numParams)
	}
	clear(w.naiveAcc)
	d := w.m.inSize
	for i := range y {
		if _, err := w.MeanGrad(w.naiveG, theta, x[i*d:(i+1)*d], y[i:i+1]); err != nil {
			return 0, err
		}
		c := 1.0
		if n := math.Sqrt(sumSq(w.naiveG)); n > clip*clipShade {
			c = clip * clipShade / n
		}
		for j, v := range w.naiveG {
			w.naiveAcc[j] += c * float64(v)
		}
	}
	for j, v := range w.naiveAcc {
		dst[j] = float32(v)
	}
	return len(y), nil
}

// Evaluate returns the mean loss and accuracy of theta on the examples x
// (len(y) of them), in batches of MaxBatch. An empty set gives zero
// Metrics. Errors: ErrShape, ErrNonFinite.
func (w *Workspace) Evaluate(theta, x []float32, y []int32) (Metrics, error) {
	d := w.m.inSize
	if len(x) != len(y)*d {
		return Metrics{}, fmt.Errorf("%w: x has %d values, want %d examples × %d", ErrShape, len(x), len(y), d)
	}
	var loss float64
	correct := 0
	for lo := 0; lo < len(y); lo += w.maxB {
		hi := min(lo+w.maxB, len(y))
		xb, yb := x[lo*d:hi*d], y[lo:hi]
		if err := w.check(nil, theta, xb, yb); err != nil {
			return Metrics{}, err
		}
		p := w.pass(hi - lo)
		w.forward(p, theta, xb)
		l, c := w.softmaxXent(hi-lo, yb, nil, 0)
		loss += l
		correct += c
	}
	if len(y) == 0 {
		return Metrics{}, nil
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return Metrics{}, fmt.Errorf("%w: evaluation loss", ErrNonFinite)
	}
	n := float64(len(y))
	return Metrics{Loss: loss / n, Accuracy: float64(correct) / n, N: len(y)}, nil
}

// EvaluateDataset is Evaluate on a whole dataset, after CheckDataset.
func (w *Workspace) EvaluateDataset(theta []float32, d *dataset.Dataset) (Metrics, error) {
	if err := w.m.CheckDataset(d); err != nil {
		return Metrics{}, err
	}
	return w.Evaluate(theta, d.X, d.Y)
}

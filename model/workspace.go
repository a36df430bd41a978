package model

import (
	"errors"
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
	states  []layerState
	bounds  clipBounds
	// coef holds the clip factors cᵢ the last ClippedSum applied (0 for a
	// dropped example); tests read it.
	coef []float32
	// acc is the clipped sum's float64 accumulator, allocated on first use.
	acc []float64
	// naive reference buffers, allocated on first use
	naiveG   []float32
	naiveAcc []float64
	// ClippedSumIndexed buffers, allocated on first use
	gx []float32
	gy []int32
	// targets holds a NextToken batch's targets [B, T], allocated on
	// first use.
	targets []int32
}

// clipShade is the relative margin under the clip norm (see ClippedSum).
const clipShade = 1 - 1.0/(1<<16)

// Evaluation is a model's loss and accuracy over a set of examples
// (Workspace.Evaluate). It is not a Prometheus collector: those are the
// Metrics types of packages coordinator and node.
type Evaluation struct {
	// Loss is the mean softmax cross-entropy (natural log); for a
	// NextToken model, the mean over all target tokens (not padding) of
	// the set, so exp(Loss) is the perplexity.
	Loss float64
	// Accuracy is the fraction of examples whose arg-max logit is the
	// label; for a NextToken model, the fraction of target tokens.
	Accuracy float64
	// N is the number of examples.
	N int
	// Tokens is, for a NextToken model, the number of target tokens Loss
	// and Accuracy average over; 0 otherwise.
	Tokens int
}

// NewWorkspace allocates buffers for batches of up to maxBatch examples.
func (m *Model) NewWorkspace(maxBatch int) (*Workspace, error) {
	if maxBatch < 1 {
		return nil, fmt.Errorf("%w: max batch %d < 1", ErrShape, maxBatch)
	}
	if m.frozen && m.base == nil {
		return nil, errNoBase
	}
	workers := min(runtime.GOMAXPROCS(0), 8)
	L := len(m.layers)
	w := &Workspace{m: m, maxB: maxBatch, workers: workers,
		act: make([][]float32, L+1), grad: make([][]float32, L+1),
		needDin: make([]bool, L), states: make([]layerState, L), bounds: newClipBounds(maxBatch), coef: make([]float32, maxBatch)}
	w.act[0] = make([]float32, maxBatch*m.inSize)
	// A layer's input gradient is needed only if a trainable layer is
	// below it: the loss gradient goes no further down.
	paramBelow := false
	for l, ly := range m.layers {
		w.needDin[l] = paramBelow
		if m.tauSize[l] > 0 {
			paramBelow = true
		}
		n := maxBatch * shapeSize(ly.outShape())
		w.act[l+1] = make([]float32, n)
		if w.needDin[l] || m.tauSize[l] > 0 {
			// Its output's gradient: below the lowest trainable layer no
			// backward pass runs (backward), and none is needed.
			w.grad[l+1] = make([]float32, n)
		}
		w.states[l] = ly.newState(maxBatch, workers, w.needDin[l])
		if rs, ok := w.states[l].(*resState); ok {
			rs.place(m, l)
		}
		if hu, ok := w.states[l].(headUser); ok {
			hu.setHead(m.leafHead(m.leaves[l][0]))
		}
	}
	return w, nil
}

// MaxBatch returns the largest batch the workspace accepts.
func (w *Workspace) MaxBatch() int { return w.maxB }

// Model returns the model the workspace computes for.
func (w *Workspace) Model() *Model { return w.m }

// check validates one call's arguments: lengths, labels and token ids.
func (w *Workspace) check(dst, theta, x []float32, y []int32) error {
	return w.m.checkBatch(w.maxB, dst, theta, x, y)
}

// checkBatch validates the arguments of a call on an engine for batches of
// up to maxB examples: lengths, labels and token ids (every engine's one
// check).
func (m *Model) checkBatch(maxB int, dst, theta, x []float32, y []int32) error {
	if len(theta) != m.numParams {
		return fmt.Errorf("%w: theta has %d values, model has %d parameters", ErrShape, len(theta), m.numParams)
	}
	if dst != nil && len(dst) != m.numParams {
		return fmt.Errorf("%w: dst has %d values, model has %d parameters", ErrShape, len(dst), m.numParams)
	}
	B := len(y)
	if B > maxB {
		return fmt.Errorf("%w: batch of %d exceeds the engine's max batch %d", ErrShape, B, maxB)
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
	return &pass{be: w.m.backend, B: B, workers: w.workers, ids: w.act[0]}
}

// forward loads x into the internal layout and runs every layer.
func (w *Workspace) forward(p *pass, theta, x []float32) {
	m := w.m
	in := w.act[0]
	if m.seqT > 0 {
		w.loadSequences(p.B, x)
	} else if len(m.inShape) == 3 && m.inShape[0] > 1 {
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
	for l := range m.layers {
		w.states[l].forward(p, w.layerParams(theta, l), w.act[l], w.act[l+1])
	}
}

// layerParams returns layer l's parameters: its part of theta, or the
// frozen values of a frozen layer; for a residual block, its part of
// theta, the block resolving its nested layers itself (resState.place).
func (w *Workspace) layerParams(theta []float32, l int) []float32 {
	if _, ok := w.states[l].(*resState); ok {
		return trained(w, theta, l)
	}
	return w.m.leafParams(theta, w.m.leaves[l][0])
}

// trained returns layer l's part of v, a vector laid out as theta (a
// gradient, an accumulator): its trainable parameters' values.
func trained[T any](w *Workspace, v []T, l int) []T {
	off, n := w.m.tauOff[l], w.m.tauSize[l]
	return v[off : off+n : off+n]
}

// backward propagates grad[L] down to every layer that needs it: the
// layers that train, and those above one that does.
func (w *Workspace) backward(p *pass, theta []float32) {
	for l := len(w.m.layers) - 1; l >= 0; l-- {
		if !w.needDin[l] && w.m.tauSize[l] == 0 {
			continue
		}
		var din []float32
		if w.needDin[l] {
			din = w.grad[l]
		}
		w.states[l].backward(p, w.layerParams(theta, l), w.act[l], w.act[l+1], w.grad[l+1], din)
	}
}

// paramGrads writes every parameter layer's gradient (alpha · Σ over the
// batch of the current grad buffers) into dst.
func (w *Workspace) paramGrads(p *pass, dst []float32, alpha float32) {
	for l := range w.m.layers {
		if w.m.tauSize[l] == 0 {
			continue
		}
		w.states[l].paramGrad(p, trained(w, dst, l), w.act[l], w.act[l+1], w.grad[l+1], alpha)
	}
}

// softmaxXent computes the summed softmax cross-entropy of the logits in
// act[L] and, if dlogits is non-nil, writes scale·(softmax − onehot(y)) to
// it. It returns the loss sum (float64, log-sum-exp with the max
// subtracted) and the number of correct arg-max predictions.
func (w *Workspace) softmaxXent(B int, y []int32, dlogits []float32, scale float32) (float64, int) {
	if w.m.seqT > 0 {
		r := w.nextTokenXent(B, dlogits, scale)
		return r.sum, r.correct
	}
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

// checkClipped validates the arguments of ClippedSum, ClippedSumIndexed
// (x and y nil: the rows are checked by index) and ClippedSumNaive: dst,
// the clip norm's range, lengths and labels (w.check), and θ's finiteness.
func (w *Workspace) checkClipped(dst, theta, x []float32, y []int32, clip float64) error {
	return w.m.checkClipped(w.maxB, dst, theta, x, y, clip)
}

// checkClipped is Workspace.checkClipped for any engine's max batch.
func (m *Model) checkClipped(maxB int, dst, theta, x []float32, y []int32, clip float64) error {
	if dst == nil {
		return fmt.Errorf("%w: nil dst", ErrShape)
	}
	if err := CheckClipNorm(clip); err != nil {
		return err
	}
	if err := m.checkBatch(maxB, dst, theta, x, y); err != nil {
		return err
	}
	if !allFinite(theta) {
		return fmt.Errorf("%w: in the parameters", ErrNonFinite)
	}
	return nil
}

// ClippedSum writes into dst the sum over the batch of per-example
// gradients of the softmax cross-entropy, each clipped to L2 norm at most
// clip over all parameters (flat clipping: gᵢ·min(1, clip/‖gᵢ‖); Abadi et
// al. 2016, "Deep Learning with Differential Privacy"), and returns the
// batch size len(y). An empty batch writes zeros. dst must not alias theta.
// The first call allocates a float64 buffer of NumParams values.
//
// It never materializes the B per-example gradients: one forward and one
// backward pass store every layer's input and output gradient; per-example
// norms come from ghost norms (linear, embedding, and convolutions where
// cheaper) or small per-example products (other convolutions, layer norm);
// then, since every layer's per-example gradient is linear in its output
// gradient δᵢ, the stored δᵢ are rescaled by the clip factor cᵢ and the
// parameter gradients are formed once, as in a non-private step
// ("book-keeping", Bu, Wang, Zha and Karypis 2023, "Differentially Private
// Optimization on Large Model at Small Cost", Alg. 1; ghost clipping, Li,
// Tramèr, Liang and Hashimoto 2022).
//
// # Rounding
//
// Let Gᵢ be example i's gradient as the stored activations and output
// gradients define it (Gᵢ = Σₜ dₜãₜᵀ per layer, computed exactly: what the
// example adds to the sum in exact arithmetic), C' = C·(1−2⁻¹⁶), u = 2⁻²⁴
// and γₙ = nu/(1−nu) (Higham 2002, "Accuracy and Stability of Numerical
// Algorithms", §3.1; the model of arithmetic is in bound.go). From the
// stored values each layer bounds (see the layers' bound methods, which
// state their formulas):
//
//   - sqᵢ: the squared norm of example i's gradient as the fast path
//     computes it (ghost norms from float32 Gram matrices, materialized
//     float32 products), plus, for ghost norms, a rigorous bound on the
//     error of that computation, however the terms cancel;
//   - Eᵢ: with Nᵢ = √sqᵢ + Eᵢ, both ‖Gᵢ‖ ≤ Nᵢ and ‖rᵢ‖ ≤ cᵢNᵢ + Hᵢ, where
//     rᵢ is what example i actually adds to the float64 accumulator, its
//     rounding errors included: Eᵢ = Σₗ λₗρᵢₗ with ρᵢₗ = Σₜ‖dₜ‖‖ãₜ‖ ≥ ‖Gᵢₗ‖
//     and λₗ ≈ γ₂₅₆(u) + u ≈ 1.5e-5 (ghost and linear: blocks of 256
//     rows), γ₆₄(u) ≈ 3.8e-6 (materialized: per-example products in
//     pieces of at most 64 rows), ≈ 1e-6 (layer norm and embedding:
//     float64 sums);
//   - Hᵢ: the absolute rounding error of underflow (≈ 2⁻¹⁵⁰ per element),
//     independent of cᵢ.
//
// Then cᵢ = min(1, (C'−Hᵢ)/Nᵢ), rounded down to a float32 (clipFactor), so
// ‖cᵢGᵢ‖ ≤ C' and ‖rᵢ‖ ≤ C'. The sum is formed in blocks of at most 256
// rows (examples × output positions) by float32 products whose results are
// added into a float64 accumulator, which is rounded to float32 once. So
// the computed sum Ŝ satisfies
//
//	‖Ŝ − Σᵢ cᵢGᵢ‖ ≤ (1+u)·Σᵢ (cᵢEᵢ + Hᵢ) + u·‖Σᵢ cᵢGᵢ‖ + 2⁻¹⁵⁰·√NumParams
//	‖Ŝ‖ ≤ (1+u)·count·C' + 2⁻¹⁵⁰·√NumParams ≤ count·C
//
// for clip norms in [MinClipNorm, MaxClipNorm]: each example's own rounding
// is charged to its clip, and the 2⁻¹⁶ margin covers the final rounding. A
// whole-batch float32 product (the old code) had an error of up to
// γ_B·Σᵢ cᵢρᵢ, which exceeds the margin for batches of a few thousand.
//
// Nᵢ exceeds ‖Gᵢ‖ by a relative λ for linear, embedding and layer-norm
// layers (ρᵢ = ‖Gᵢ‖ there), and for a convolution by λ·ρᵢ/‖Gᵢ‖ plus, for
// ghost norms, up to κ·(ρᵢ/‖Gᵢ‖)²/2 (κ ≈ γ_K + γ_O; see conv.bound). On
// typical examples of the presets that is at most 1.6e-5 (logreg),
// 2.8e-5 (mlp), 2.3e-5 (textbag) and 3.5e-5 (cnn, where ρᵢ/‖Gᵢ‖ is 5 to
// 10; TestClipBoundTightOnPresets), and 6.1e-5 for the transformer (its
// linear layers at T positions are 1×1 convolutions, seqLinear; its
// per-position layer norms and embeddings add γ_T(u64)·ρᵢ for their float64
// sums over positions, seqLNState.bound and seqEmbedState.bound). Examples whose terms
// cancel across positions (ρᵢ ≫ ‖Gᵢ‖) are over-clipped instead of escaping
// the clip; that is safe.
//
// What the bound does not cover is the rounding of the other examples'
// terms, which depends on the whole batch (which block each example falls
// in): adding or removing one example changes Ŝ by rⱼ (‖rⱼ‖ ≤ C') plus a
// change in the others' rounding of at most 2·Σᵢ(cᵢEᵢ + Hᵢ) + 2u·‖Ŝ‖ in
// the worst case, where every rounding goes the same way: about
// 2·(λ·ρ/‖G‖ + u)·C per example, which at B = 256 with every example
// clipped came to 1.4e-2·C for the mlp and the cnn presets (5.4e-5·C and
// 5.6e-5·C per example; random inputs, initial parameters); a random-walk
// estimate is √256·u·C ≈ 1e-6·C per example.
//
// # Non-finite examples
//
// An example whose bounds are not finite (a NaN or an infinity in its
// stored values, such as features so large that the forward pass
// overflows, or a ghost norm below its own error bound) gets cᵢ = 0: its
// stored values are zeroed, so it adds exactly zero, and it is still
// counted. Neither the result's count nor any error says that it happened,
// and it costs the same work as any other example.
//
// Results are deterministic: the same bits whatever GOMAXPROCS is.
// Errors: ErrShape, ErrBadClip (clip outside [MinClipNorm, MaxClipNorm]),
// ErrNonFinite (theta not finite; dst then holds unspecified values).
func (w *Workspace) ClippedSum(dst, theta, x []float32, y []int32, clip float64) (int, error) {
	if err := w.checkClipped(dst, theta, x, y, clip); err != nil {
		return 0, err
	}
	if len(y) == 0 {
		clear(dst)
		return 0, nil
	}
	w.clippedSum(dst, theta, x, y, clip, true, true)
	return len(y), checkSum(dst)
}

// checkSum returns ErrNonFinite if the sum holds an infinity (a sum above
// the float32 range: impossible for clip norms up to MaxClipNorm).
func checkSum(dst []float32) error {
	if !allFinite(dst) {
		return fmt.Errorf("%w: in the clipped sum", ErrNonFinite)
	}
	return nil
}

// clippedSum adds the clipped sum of the batch (x, y), already checked and
// not empty, to the float64 accumulator w.acc, which holds nothing yet if
// fresh; if final, it writes the total rounded to float32 into dst instead
// (see ClippedSum and put32). It leaves the clip factors in w.coef and the
// bounds in w.bounds.
func (w *Workspace) clippedSum(dst, theta, x []float32, y []int32, clip float64, fresh, final bool) {
	if w.acc == nil {
		w.acc = make([]float64, w.m.numParams)
	}
	acc := w.acc
	B := len(y)
	if B == 0 {
		return
	}
	m := w.m
	p := w.pass(B)
	w.forward(p, theta, x)
	L := len(m.layers)
	w.softmaxXent(B, y, w.grad[L], 1)
	w.backward(p, theta)
	b := w.bounds
	b.reset(B)
	for l := range m.layers {
		if m.tauSize[l] > 0 {
			w.states[l].bound(p, w.act[l], w.act[l+1], w.grad[l+1], b)
		}
	}
	coef := w.coef[:B]
	for i := range coef {
		coef[i] = clipFactor(b.sq[i], b.share[i], b.floor[i], clip)
	}
	for l := range m.layers {
		if m.tauSize[l] == 0 {
			continue
		}
		d := w.grad[l+1]
		applyCoef(w.states[l], coef, w.act[l], d, len(d)/w.maxB)
		p.coef, p.fresh, p.final = coef, fresh, final
		w.states[l].accGrad(p, trained(w, acc, l), trained(w, dst, l), w.act[l], w.act[l+1], d)
	}
}

// applyCoef scales example i's stored output gradients d (per values each)
// by its clip factor coef[i] < 1, or, for coef[i] = 0, clears the example's
// stored values (st.clearExample), so that st.accGrad adds cᵢ·Gᵢ.
func applyCoef(st layerState, coef, in, d []float32, per int) {
	for i, c := range coef {
		switch {
		case c == 0:
			st.clearExample(i, in, d)
		case c < 1:
			row := d[i*per : (i+1)*per]
			for j := range row {
				row[j] *= c
			}
		}
	}
}

// ClippedSumIndexed is ClippedSum over the rows idx of d (a Poisson batch
// drawn by package sampling, say), of any length: rows are gathered into
// workspace buffers MaxBatch at a time and the chunks' clipped sums are
// added into one float64 accumulator, rounded to float32 once (so chunking
// adds no rounding of its own). It returns len(idx). The first call
// allocates a batch buffer and a float64 buffer of NumParams values.
// Errors: those of ClippedSum and CheckDataset, and ErrShape for an index
// outside [0, d.Len()).
func (w *Workspace) ClippedSumIndexed(dst, theta []float32, d *dataset.Dataset, idx []int, clip float64) (int, error) {
	if err := w.m.CheckDataset(d); err != nil {
		return 0, err
	}
	for _, i := range idx {
		if i < 0 || i >= d.Len() {
			return 0, fmt.Errorf("%w: index %d outside dataset %q of %d rows", ErrShape, i, d.Name, d.Len())
		}
	}
	if err := w.checkClipped(dst, theta, nil, nil, clip); err != nil {
		return 0, err
	}
	if w.gx == nil {
		w.gx = make([]float32, w.maxB*w.m.inSize)
		w.gy = make([]int32, w.maxB)
	}
	if len(idx) == 0 {
		clear(dst)
		return 0, nil
	}
	for lo := 0; lo < len(idx); lo += w.maxB {
		chunk := idx[lo:min(lo+w.maxB, len(idx))]
		d.Gather(w.gx, w.gy, chunk)
		x, y := w.gx[:len(chunk)*w.m.inSize], w.gy[:len(chunk)]
		if err := w.check(nil, theta, x, y); err != nil {
			return 0, err
		}
		w.clippedSum(dst, theta, x, y, clip, lo == 0, lo+w.maxB >= len(idx))
	}
	return len(idx), checkSum(dst)
}

// ClippedSumNaive computes the same result as ClippedSum the slow way, as a
// reference: it materializes each example's gradient with a batch-of-one
// backward pass (MeanGrad), clips it to C·(1−2⁻¹⁶) in float64 without
// ClippedSum's error bounds, and accumulates in float64. An example whose
// float32 gradient is not finite contributes zero (ClippedSum may still
// clip and add such an example when its bounds are finite). It allocates
// two parameter-sized buffers on first use. Errors: those of ClippedSum.
func (w *Workspace) ClippedSumNaive(dst, theta, x []float32, y []int32, clip float64) (int, error) {
	if err := w.checkClipped(dst, theta, x, y, clip); err != nil {
		return 0, err
	}
	if w.naiveG == nil {
		w.naiveG = make([]float32, w.m.numParams)
		w.naiveAcc = make([]float64, w.m.numParams)
	}
	clear(w.naiveAcc)
	d := w.m.inSize
	for i := range y {
		if _, err := w.MeanGrad(w.naiveG, theta, x[i*d:(i+1)*d], y[i:i+1]); errors.Is(err, ErrNonFinite) {
			continue
		} else if err != nil {
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
// (len(y) of them), in batches of MaxBatch. An empty set gives a zero
// Evaluation. Errors: ErrShape, ErrNonFinite.
func (w *Workspace) Evaluate(theta, x []float32, y []int32) (Evaluation, error) {
	d := w.m.inSize
	if len(x) != len(y)*d {
		return Evaluation{}, fmt.Errorf("%w: x has %d values, want %d examples × %d", ErrShape, len(x), len(y), d)
	}
	var loss float64
	correct, tokens := 0, 0
	for lo := 0; lo < len(y); lo += w.maxB {
		hi := min(lo+w.maxB, len(y))
		xb, yb := x[lo*d:hi*d], y[lo:hi]
		if err := w.check(nil, theta, xb, yb); err != nil {
			return Evaluation{}, err
		}
		p := w.pass(hi - lo)
		w.forward(p, theta, xb)
		if w.m.seqT > 0 {
			r := w.nextTokenXent(hi-lo, nil, 0)
			loss += r.tokenSum
			correct += r.correct
			tokens += r.tokens
			continue
		}
		l, c := w.softmaxXent(hi-lo, yb, nil, 0)
		loss += l
		correct += c
	}
	if len(y) == 0 {
		return Evaluation{}, nil
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return Evaluation{}, fmt.Errorf("%w: evaluation loss", ErrNonFinite)
	}
	n := float64(len(y))
	if w.m.seqT > 0 {
		n = float64(max(tokens, 1))
	}
	return Evaluation{Loss: loss / n, Accuracy: float64(correct) / n, N: len(y), Tokens: tokens}, nil
}

// EvaluateDataset is Evaluate on a whole dataset, after CheckDataset.
func (w *Workspace) EvaluateDataset(theta []float32, d *dataset.Dataset) (Evaluation, error) {
	if err := w.m.CheckDataset(d); err != nil {
		return Evaluation{}, err
	}
	return w.Evaluate(theta, d.X, d.Y)
}

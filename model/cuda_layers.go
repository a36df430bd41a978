//go:build cuda

package model

import (
	"errors"

	"gorgonia.org/cu"
)

// The CUDA engine's layers: for each layer kind, its device buffers (what
// the CPU keeps in the layer's state) and its steps of ClippedSum:
// forward, backward, the per-example sums its bound takes (layerStats, on
// the device), the bound itself (layerBound: the CPU's boundExample, on the
// host, so that the clip rule and its error bound stay in one place), the
// clip (layerClip) and the clipped sum (layerAccGrad). Layouts are the
// CPU's (layer.go): activations channels-last, a convolution's unfolded
// input in patch order (kh, kw, c) and its weights permuted to
// [O, kh, kw, C], so that the tests can hand the device's stored values to
// the CPU's exact reference.

// cudaLayerBufs are one layer's device buffers beyond its activations.
type cudaLayerBufs struct {
	// conv: the unfolded input [maxB·T, K] and its gradient, the permuted
	// weights [O, K]; materializing, the per-example gradients
	// [maxB, O·K]; ghost, the Gram matrices [maxB, T, T]; per output
	// position, Σa², Σd², αₜ and βₜ (float64 [maxB·T]).
	cols, dcols, wp cu.DevicePtr
	gi, ga, gd      cu.DevicePtr
	a2, d2, al, be  cu.DevicePtr
	// maxpool: the input index of each output's maximum (int32).
	arg cu.DevicePtr
	// embeddingbag: 1/nᵢ (float32 [maxB]) and the token index (embed_acc);
	// embedding: the same over the maxB·T positions.
	inv, off, ex cu.DevicePtr
	// layernorm: x̂ [maxB, f] and 1/σ [maxB] (at T positions: [maxB·T, f]
	// and [maxB·T]).
	xhat, rstd cu.DevicePtr
	// attention: the probabilities and the scores' gradients [maxB, H, T, T].
	probs, dS cu.DevicePtr
}

// statRows is the number of per-example float64 sums (rows of maxB in the
// engine's stats buffer) a parameter layer's bound takes.
func statRows(ly cudaUnit) int {
	switch ly.(type) {
	case *linear:
		return 2 // Σa², Σd²
	case *conv:
		return 10 // rho, sat, sb, the bias n, n̂ or ‖Ĝᵢ‖², eK, eO, eP, sa, sd (convStats)
	case *embedBag:
		return 1 // Σd²
	case *layerNorm:
		return 2 // n, Σx̂²
	}
	return seqStatRows(ly)
}

// scratchSize is the float32 count of the scratch buffer: accGrad's block
// products (up to maxBlockGroup of the largest weight that is summed in
// blocks) and a convolution's non-private weight gradient.
func (e *cudaEngine) scratchSize() int {
	n := 1
	group := func(rows, ok int) int {
		return min((rows+blockRows-1)/blockRows, maxBlockGroup) * ok
	}
	for _, ly := range e.ly {
		switch ly := ly.(type) {
		case *linear:
			n = max(n, group(e.maxB, ly.out*ly.in))
		case *conv:
			// Ghost: accGrad's blocks; either way the non-private
			// gradient's (layerParamGrad).
			n = max(n, group(e.maxB*ly.T, ly.o*ly.K))
		}
	}
	return n
}

// allocLayer allocates layer l's buffers with a.
func (e *cudaEngine) allocLayer(l int, a func(*cu.DevicePtr, int) error) error {
	B := e.maxB
	s := &e.lb[l]
	switch ly := e.ly[l].(type) {
	case *conv:
		T, K, O := ly.T, ly.K, ly.o
		errs := []error{a(&s.cols, 4*B*T*K), a(&s.wp, 4*O*K),
			a(&s.a2, 8*B*T), a(&s.d2, 8*B*T), a(&s.al, 8*B*T), a(&s.be, 8*B*T)}
		if e.needDin[l] {
			errs = append(errs, a(&s.dcols, 4*B*T*K))
		}
		if ly.ghost {
			errs = append(errs, a(&s.ga, 4*B*T*T), a(&s.gd, 4*B*T*T))
		} else {
			errs = append(errs, a(&s.gi, 4*B*O*K))
		}
		return errors.Join(errs...)
	case *pool:
		if ly.max {
			return a(&s.arg, 4*B*ly.c*ly.ho*ly.wo)
		}
	case *embedBag:
		return errors.Join(a(&s.inv, 4*B), a(&s.off, 4*(ly.V+1)), a(&s.ex, 4*B*ly.L))
	case *layerNorm:
		return errors.Join(a(&s.xhat, 4*B*ly.f), a(&s.rstd, 4*B))
	default:
		return e.seqAlloc(l, a)
	}
	return nil
}

// geometry is a convolution's shape as kernel arguments: B, c, h, w, k, s,
// p, ho, wo.
func (ly *conv) geometry(B int) []karg {
	return []karg{i32(B), i32(ly.c), i32(ly.h), i32(ly.w), i32(ly.k), i32(ly.s), i32(ly.p), i32(ly.ho), i32(ly.wo)}
}

// poolGeometry is a pooling layer's shape as kernel arguments: B, c, h, w,
// k, s, ho, wo, max.
func (ly *pool) geometry(B int) []karg {
	return []karg{i32(B), i32(ly.c), i32(ly.h), i32(ly.w), i32(ly.k), i32(ly.s), i32(ly.ho), i32(ly.wo), flag(ly.max)}
}

// layerW returns the device address of layer l's parameters.
func (e *cudaEngine) layerW(l int) cu.DevicePtr { return off4(e.theta, e.off[l]) }

// layerForward runs the forward pass of a conv, pool, embeddingbag or
// layernorm layer.
func (e *cudaEngine) layerForward(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	in, out := e.act[l], e.act[l+1]
	switch ly := e.ly[l].(type) {
	case *conv:
		T, K, O := ly.T, ly.K, ly.o
		w := e.layerW(l)
		if err := launch1(k.convPermute, O*K, i32(O), i32(ly.c), i32(ly.k*ly.k), i32(0), ptr(w), ptr(s.wp)); err != nil {
			return err
		}
		if err := launch1(k.convIm2col, B*T*K, append(ly.geometry(B), ptr(in), ptr(s.cols))...); err != nil {
			return err
		}
		if err := e.d.sgemm(false, true, B*T, O, K, 1, s.cols, K, s.wp, K, 0, out, O); err != nil {
			return err
		}
		return launch1(k.biasAdd, B*T*O, i32(B*T), i32(O), ptr(out), ptr(off4(w, O*K)))
	case *pool:
		return launch1(k.poolFwd, B*ly.c*ly.ho*ly.wo, append(ly.geometry(B), ptr(in), ptr(out), ptr(s.arg))...)
	case *embedBag:
		return launch1(k.embedFwd, B*ly.D, i32(B), i32(ly.L), i32(ly.D), ptr(in), ptr(e.layerW(l)), ptr(s.inv), ptr(out))
	case *layerNorm:
		return launch(k.lnFwd, B, 1, 256, 1, i32(ly.f), f64(ly.eps), ptr(in), ptr(e.layerW(l)), ptr(s.xhat), ptr(s.rstd), ptr(out))
	default:
		return e.seqForward(l, B)
	}
}

// layerBackward writes the input gradient of a conv, pool or layernorm
// layer (an embedding bag is always first and has none).
func (e *cudaEngine) layerBackward(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	dout, din := e.grad[l+1], e.grad[l]
	switch ly := e.ly[l].(type) {
	case *conv:
		T, K, O := ly.T, ly.K, ly.o
		if err := e.d.sgemm(false, false, B*T, K, O, 1, dout, O, s.wp, K, 0, s.dcols, K); err != nil {
			return err
		}
		return launch1(k.convCol2im, B*ly.h*ly.w*ly.c, append(ly.geometry(B), ptr(s.dcols), ptr(din))...)
	case *pool:
		return launch1(k.poolBwd, B*ly.c*ly.h*ly.w, append(ly.geometry(B), ptr(dout), ptr(s.arg), ptr(din))...)
	case *layerNorm:
		return launch(k.lnBwd, B, 1, 256, 1, i32(ly.f), ptr(e.layerW(l)), ptr(s.xhat), ptr(s.rstd), ptr(dout), ptr(din))
	default:
		return e.seqBackward(l, B)
	}
}

// statRow returns the device address of row r of layer l's stats.
func (e *cudaEngine) statRow(l, r int) cu.DevicePtr { return off8(e.stats, (e.statOff[l]+r)*e.maxB) }

// layerStats computes parameter layer l's per-example sums (statRows rows)
// on the device.
func (e *cudaEngine) layerStats(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	dout := e.grad[l+1]
	sumsq := func(rows, cols int, x cu.DevicePtr, out cu.DevicePtr) error {
		return launch(k.rowSumsq, rows, 1, 256, 1, i32(cols), ptr(x), ptr(out))
	}
	switch ly := e.ly[l].(type) {
	case *linear:
		return errors.Join(sumsq(B, ly.in, e.act[l], e.statRow(l, 0)), sumsq(B, ly.out, dout, e.statRow(l, 1)))
	case *conv:
		T, K, O := ly.T, ly.K, ly.o
		if err := errors.Join(sumsq(B*T, K, s.cols, s.a2), sumsq(B*T, O, dout, s.d2)); err != nil {
			return err
		}
		up := ly.boundConsts().up
		if err := launch(k.convRows, B, 1, 256, 1, i32(T), f64(up), ptr(s.a2), ptr(s.d2), ptr(s.al), ptr(s.be),
			ptr(e.statRow(l, 0)), i32(e.maxB)); err != nil {
			return err
		}
		if err := launch(k.convBiasn, B, 1, 256, 1, i32(T), i32(O), ptr(dout), ptr(e.statRow(l, 3))); err != nil {
			return err
		}
		if !ly.ghost {
			if err := launch1(k.convPergrad, B*O*K, i32(B), i32(T), i32(O), i32(K), i32(ly.pieceRows()), ptr(dout), ptr(s.cols), ptr(s.gi)); err != nil {
				return err
			}
			return sumsq(B, O*K, s.gi, e.statRow(l, 4))
		}
		if err := e.d.sgemmBatched(false, true, B, T, T, K, s.cols, K, T*K, s.cols, K, T*K, s.ga, T, T*T); err != nil {
			return err
		}
		if err := e.d.sgemmBatched(false, true, B, T, T, O, dout, O, T*O, dout, O, T*O, s.gd, T, T*T); err != nil {
			return err
		}
		return launch(k.convGhost, B, 1, 256, 1, i32(T), ptr(s.ga), ptr(s.gd), ptr(s.al), ptr(s.be), ptr(e.statRow(l, 4)), i32(e.maxB))
	case *embedBag:
		return sumsq(B, ly.D, dout, e.statRow(l, 0))
	case *layerNorm:
		return launch(k.lnStats, B, 1, 256, 1, i32(ly.f), ptr(s.xhat), ptr(dout), ptr(e.statRow(l, 0)), i32(e.maxB))
	default:
		return e.seqStats(l, B)
	}
}

// layerBound adds parameter layer l's bounds for the B examples from the
// downloaded sums, through the CPU engine's formulas (boundExample; for a
// layer norm at T positions, boundSeqExample).
func (e *cudaEngine) layerBound(l, B int, b clipBounds) {
	row := func(r int) []float64 { return e.hstats[(e.statOff[l]+r)*e.maxB:][:B] }
	switch ly := e.ly[l].(type) {
	case *linear:
		a2, d2 := row(0), row(1)
		for i := 0; i < B; i++ {
			ly.boundExample(b, i, a2[i], d2[i])
		}
	case *conv:
		k := ly.boundConsts()
		var r [10][]float64
		for q := range r {
			r[q] = row(q)
		}
		for i := 0; i < B; i++ {
			st := convStats{rho: r[0][i], sat: r[1][i], sb: r[2][i], n: r[3][i] + r[4][i]}
			if ly.ghost {
				st.eK, st.eO, st.eP, st.sa, st.sd = r[5][i], r[6][i], r[7][i], r[8][i], r[9][i]
			}
			ly.boundExample(b, i, &k, &st)
		}
	case *embedBag:
		d2 := row(0)
		for i := 0; i < B; i++ {
			if n := e.emb.ntok[i]; n > 0 {
				ly.boundExample(b, i, n, e.emb.c2[i], e.emb.inv[i], d2[i])
			}
		}
	case *layerNorm:
		n, x2 := row(0), row(1)
		for i := 0; i < B; i++ {
			ly.boundExample(b, i, n[i], x2[i])
		}
	case *seqEmbed:
		n, rho := row(0), row(1)
		for i := 0; i < B; i++ {
			ly.boundExample(b, i, n[i], rho[i])
		}
	case *seqLayerNorm:
		n, rho2, xn := row(0), row(1), row(2)
		for i := 0; i < B; i++ {
			ly.boundSeqExample(b, i, n[i], rho2[i], xn[i])
		}
	}
}

// layerClip applies the clip factors to parameter layer l's stored values:
// clearExample's rows zeroed for c = 0, the output gradient rows scaled by
// c < 1 (ClippedSum's loop).
func (e *cudaEngine) layerClip(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	rows := func(x cu.DevicePtr, cols int, scale bool) error {
		return launch1(k.clipRows, B*cols, i32(B), i32(cols), ptr(x), ptr(e.coef), flag(scale))
	}
	dout := e.grad[l+1]
	switch ly := e.ly[l].(type) {
	case *linear:
		return errors.Join(rows(e.act[l], ly.in, false), rows(dout, ly.out, true))
	case *conv:
		// A dropped example's Ĝᵢ is skipped by conv_gsum.
		return errors.Join(rows(s.cols, ly.T*ly.K, false), rows(dout, ly.T*ly.o, true))
	case *embedBag:
		return rows(dout, ly.D, true)
	case *layerNorm:
		return errors.Join(rows(s.xhat, ly.f, false), rows(dout, ly.f, true))
	case *seqEmbed:
		return rows(dout, ly.T*ly.D, true)
	case *seqLayerNorm:
		n := ly.t * ly.f
		return errors.Join(rows(s.xhat, n, false), rows(dout, n, true))
	}
	return nil
}

// layerAccGrad adds parameter layer l's clipped sum into the accumulator
// (or, if final, the total into dst): the layer's accGrad.
func (e *cudaEngine) layerAccGrad(l, B int, fresh, final bool) error {
	k := &e.d.k
	s := &e.lb[l]
	off := e.off[l]
	acc, dst := off8(e.acc, off), off4(e.dst, off)
	dout := e.grad[l+1]
	bias := func(rows, O, at int) error {
		return launch1(k.colsumPut, O, i32(rows), i32(O), ptr(dout), ptr(off8(e.acc, off+at)), ptr(off4(e.dst, off+at)),
			flag(fresh), flag(final), i32(0), f32(0))
	}
	switch ly := e.ly[l].(type) {
	case *linear:
		O, K := ly.out, ly.in
		if err := e.accGrad(O, K, B, dout, e.act[l], off, fresh, final, 0, 0); err != nil {
			return err
		}
		return bias(B, O, O*K)
	case *conv:
		T, K, O := ly.T, ly.K, ly.o
		if ly.ghost {
			if err := e.accGrad(O, K, B*T, dout, s.cols, off, fresh, final, ly.c, ly.k*ly.k); err != nil {
				return err
			}
		} else if err := launch1(k.convGsum, O*K, i32(B), i32(O), i32(ly.c), i32(ly.k*ly.k), ptr(s.gi), ptr(e.coef),
			ptr(acc), ptr(dst), flag(fresh), flag(final), i32(0), f32(0)); err != nil {
			return err
		}
		return bias(B*T, O, O*K)
	case *embedBag:
		return launch1(k.embedAcc, ly.V*ly.D, i32(ly.V), i32(ly.D), ptr(s.off), ptr(s.ex), ptr(s.inv), ptr(dout),
			ptr(acc), ptr(dst), flag(fresh), flag(final), i32(0), f32(0))
	case *layerNorm:
		return launch1(k.lnAcc, ly.f, i32(B), i32(ly.f), ptr(s.xhat), ptr(dout), ptr(acc), ptr(dst),
			flag(fresh), flag(final), i32(0), f32(0))
	default:
		return e.seqAccGrad(l, B, fresh, final)
	}
}

// layerParamGrad writes parameter layer l's summed gradient over the batch
// into dst (paramGrad with alpha 1; MeanGrad's output gradients already
// carry the 1/B).
func (e *cudaEngine) layerParamGrad(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	off := e.off[l]
	dst := off4(e.dst, off)
	dout := e.grad[l+1]
	bias := func(rows, O, at int) error {
		return launch1(k.colsumPut, O, i32(rows), i32(O), ptr(dout), ptr(e.acc), ptr(off4(e.dst, off+at)),
			i32(0), i32(0), i32(1), f32(1))
	}
	switch ly := e.ly[l].(type) {
	case *linear:
		O, K := ly.out, ly.in
		if err := e.d.sgemm(true, false, O, K, B, 1, dout, O, e.act[l], K, 0, dst, K); err != nil {
			return err
		}
		return bias(B, O, O*K)
	case *conv:
		// The sum over B·T rows in blocks of blockRows (one long product
		// would put the whole reduction on the few threads of an O×K
		// result), added in float64 and put in the public order.
		T, K, O := ly.T, ly.K, ly.o
		if err := e.accGrad(O, K, B*T, dout, s.cols, off, true, true, ly.c, ly.k*ly.k); err != nil {
			return err
		}
		return bias(B*T, O, O*K)
	case *embedBag:
		return launch1(k.embedAcc, ly.V*ly.D, i32(ly.V), i32(ly.D), ptr(s.off), ptr(s.ex), ptr(s.inv), ptr(dout),
			ptr(e.acc), ptr(dst), i32(1), i32(1), i32(1), f32(1))
	case *layerNorm:
		return launch1(k.lnAcc, ly.f, i32(B), i32(ly.f), ptr(s.xhat), ptr(dout), ptr(e.acc), ptr(dst),
			i32(1), i32(1), i32(1), f32(1))
	default:
		return e.seqParamGrad(l, B)
	}
}

// cudaEmbedHost is the host side of an embedding bag on the device: the
// batch's tokenIndex, built from the token ids the host uploads.
type cudaEmbedHost struct{ tokenIndex }

func newCUDAEmbedHost(ly *embedBag, maxB int) *cudaEmbedHost {
	return &cudaEmbedHost{newTokenIndex(ly.L, ly.V, maxB)}
}

// index builds the batch's index from its token ids x (already checked:
// integers in [-1, V)) and uploads it.
func (h *cudaEmbedHost) index(e *cudaEngine, x []float32, B int) error {
	h.build(x, B)
	s := &e.lb[0]
	return errors.Join(htod(s.off, h.off), htod(s.ex, h.ex[:h.off[len(h.off)-1]]))
}

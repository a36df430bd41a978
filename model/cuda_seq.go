//go:build cuda

package model

import (
	"errors"

	"gorgonia.org/cu"
)

// The CUDA engine's sequence layers (model/seq_*.go; issue 29): the
// embedding, linear and layer norm at T positions, causal attention, the
// mean over positions, residual blocks and the next-token loss, so that
// the transformer presets run on the GPU. Written without a GPU: NOT YET
// RUN ON ONE (docs/GPU.md says what a run on a GPU must check).
//
// Residual blocks. The engine runs a chain of units, each reading the
// previous one's output (cuda_engine.go). cudaChain flattens a residual
// block into its nested layers between two edges: cudaResStart, whose
// output is its input (the same buffer) and whose backward pass adds the
// block's output gradient (the skip) to its nested layers' input gradient,
// and cudaResAdd, whose output is the block's input plus the nested
// layers' output and whose input gradient is a copy of its output
// gradient. Every nested layer is then a unit of its own, with its own
// buffers, parameters (the block's slice of θ) and bound, as on the CPU
// (resState keeps each nested layer's kernels and bound; accGrad scales
// each one's output gradient by the clip factors as the workspace does for
// top-level layers).
//
// Per layer, the arithmetic and the bound's structure are the CPU's:
//
//   - linear at T positions (seqLinear) is a 1×1 convolution on the CPU and
//     here: its unit is the layer's *conv, so every convolution kernel,
//     the ghost-or-materialized choice and conv's bound apply as they are;
//   - layer norm at T positions: ln_fwd, ln_bwd and ln_acc over the B·T
//     rows, the per-example sums of seqLNState.bound (seq_ln_stats), the
//     formula seqLayerNorm.boundSeqExample on the host;
//   - embedding: seq_embed_fwd; the sums of seqEmbedState.bound
//     (seq_embed_stats), the formula seqEmbed.boundExample on the host;
//     the clipped sum's token rows through a token index of the B·T rows
//     (embed_acc: each row's additions in example then position order, the
//     CPU's), its position rows by colsum_put (examples in order, summed
//     in float64 before they are added to the accumulator: another order
//     than the CPU's direct additions, within the same accGamma bound);
//   - attention, meanpool: forward and backward passes with the CPU's
//     float32 roundings, in its order (kernels/cuda_kernels.cu);
//   - the next-token loss: token_xent, one thread per position.

// seqStatRows is statRows for the sequence layers' units.
func seqStatRows(ly cudaUnit) int {
	switch ly.(type) {
	case *seqEmbed:
		return 2 // n, rho (seq_embed_stats)
	case *seqLayerNorm:
		return 3 // n, rho², Σₜ‖(x̂ₜ, 1)‖ (seq_ln_stats)
	}
	return 0
}

// seqAlloc is allocLayer for the sequence layers' units.
func (e *cudaEngine) seqAlloc(l int, a func(*cu.DevicePtr, int) error) error {
	B := e.maxB
	s := &e.lb[l]
	switch ly := e.ly[l].(type) {
	case *seqLayerNorm:
		return errors.Join(a(&s.xhat, 4*B*ly.t*ly.f), a(&s.rstd, 4*B*ly.t))
	case *seqEmbed:
		return errors.Join(a(&s.inv, 4*B*ly.T), a(&s.off, 4*(ly.V+1)), a(&s.ex, 4*B*ly.T))
	case *attention:
		n := 4 * B * ly.H * ly.T * ly.T
		return errors.Join(a(&s.probs, n), a(&s.dS, n))
	}
	return nil
}

// seqForward is layerForward for the sequence layers' units.
func (e *cudaEngine) seqForward(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	in, out := e.act[l], e.act[l+1]
	switch ly := e.ly[l].(type) {
	case *seqEmbed:
		return launch1(k.seqEmbedFwd, B*ly.T*ly.D, i32(B), i32(ly.T), i32(ly.D), i32(ly.V), ptr(in), ptr(e.layerW(l)), ptr(out))
	case *seqLayerNorm:
		return launch(k.lnFwd, B*ly.t, 1, 256, 1, i32(ly.f), f64(ly.eps), ptr(in), ptr(e.layerW(l)), ptr(s.xhat), ptr(s.rstd), ptr(out))
	case *attention:
		return launch1(k.attnFwd, B*ly.H*ly.T, i32(B), i32(ly.T), i32(ly.D), i32(ly.H), f32(ly.scale), ptr(in), ptr(s.probs), ptr(out))
	case *meanPool:
		return launch1(k.meanPoolFwd, B*ly.D, i32(B), i32(ly.T), i32(ly.D), ptr(in), ptr(out))
	case *cudaResAdd:
		n := B * shapeSize(ly.shape)
		return launch1(k.add2, n, sz(n), ptr(e.act[ly.start]), ptr(in), ptr(out))
	}
	return nil // cudaResStart: its output is its input
}

// seqBackward is layerBackward for the sequence layers' units (an
// embedding is first and has no input gradient).
func (e *cudaEngine) seqBackward(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	in, dout, din := e.act[l], e.grad[l+1], e.grad[l]
	switch ly := e.ly[l].(type) {
	case *seqLayerNorm:
		return launch(k.lnBwd, B*ly.t, 1, 256, 1, i32(ly.f), ptr(e.layerW(l)), ptr(s.xhat), ptr(s.rstd), ptr(dout), ptr(din))
	case *attention:
		n := B * ly.H * ly.T
		// attn_bwd_kv reads the ds that attn_bwd_q writes: launches on one
		// stream run in order.
		if err := launch1(k.attnBwdQ, n, i32(B), i32(ly.T), i32(ly.D), i32(ly.H), f32(ly.scale), ptr(in), ptr(s.probs),
			ptr(dout), ptr(s.dS), ptr(din)); err != nil {
			return err
		}
		return launch1(k.attnBwdKV, n, i32(B), i32(ly.T), i32(ly.D), i32(ly.H), ptr(in), ptr(s.probs), ptr(s.dS), ptr(dout), ptr(din))
	case *meanPool:
		return launch1(k.meanPoolBwd, B*ly.T*ly.D, i32(B), i32(ly.T), i32(ly.D), ptr(dout), ptr(din))
	case *cudaResAdd:
		return cu.MemcpyDtoD(din, dout, int64(4*B*shapeSize(ly.shape)))
	case *cudaResStart:
		// dout is the nested layers' input gradient (the first nested
		// layer's din, which it wrote: its needDin is this unit's),
		// grad[end+1] the block's output gradient.
		n := B * shapeSize(ly.shape)
		return launch1(k.add2, n, sz(n), ptr(e.grad[ly.end+1]), ptr(dout), ptr(din))
	}
	return nil
}

// seqStats is layerStats for the sequence layers' units.
func (e *cudaEngine) seqStats(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	dout := e.grad[l+1]
	switch ly := e.ly[l].(type) {
	case *seqEmbed:
		return launch(k.seqEmbedStats, B, 1, 256, 1, i32(ly.T), i32(ly.D), ptr(e.act[l]), ptr(dout), ptr(e.statRow(l, 0)), i32(e.maxB))
	case *seqLayerNorm:
		return launch(k.seqLnStats, B, 1, 256, 1, i32(ly.t), i32(ly.f), ptr(s.xhat), ptr(dout), ptr(e.statRow(l, 0)), i32(e.maxB))
	}
	return nil
}

// seqAccGrad is layerAccGrad for the sequence layers' units.
func (e *cudaEngine) seqAccGrad(l, B int, fresh, final bool) error {
	k := &e.d.k
	s := &e.lb[l]
	off := e.off[l]
	acc, dst := off8(e.acc, off), off4(e.dst, off)
	dout := e.grad[l+1]
	switch ly := e.ly[l].(type) {
	case *seqEmbed:
		V, D, TD := ly.V, ly.D, ly.T*ly.D
		if err := launch1(k.embedAcc, V*D, i32(V), i32(D), ptr(s.off), ptr(s.ex), ptr(s.inv), ptr(dout),
			ptr(acc), ptr(dst), flag(fresh), flag(final), i32(0), f32(0)); err != nil {
			return err
		}
		return launch1(k.colsumPut, TD, i32(B), i32(TD), ptr(dout), ptr(off8(acc, V*D)), ptr(off4(dst, V*D)),
			flag(fresh), flag(final), i32(0), f32(0))
	case *seqLayerNorm:
		return launch1(k.lnAcc, ly.f, i32(B*ly.t), i32(ly.f), ptr(s.xhat), ptr(dout), ptr(acc), ptr(dst),
			flag(fresh), flag(final), i32(0), f32(0))
	}
	return nil
}

// seqParamGrad is layerParamGrad for the sequence layers' units.
func (e *cudaEngine) seqParamGrad(l, B int) error {
	k := &e.d.k
	s := &e.lb[l]
	dst := off4(e.dst, e.off[l])
	dout := e.grad[l+1]
	switch ly := e.ly[l].(type) {
	case *seqEmbed:
		V, D, TD := ly.V, ly.D, ly.T*ly.D
		if err := launch1(k.embedAcc, V*D, i32(V), i32(D), ptr(s.off), ptr(s.ex), ptr(s.inv), ptr(dout),
			ptr(e.acc), ptr(dst), i32(1), i32(1), i32(1), f32(1)); err != nil {
			return err
		}
		return launch1(k.colsumPut, TD, i32(B), i32(TD), ptr(dout), ptr(e.acc), ptr(off4(dst, V*D)),
			i32(0), i32(0), i32(1), f32(1))
	case *seqLayerNorm:
		return launch1(k.lnAcc, ly.f, i32(B*ly.t), i32(ly.f), ptr(s.xhat), ptr(dout), ptr(e.acc), ptr(dst),
			i32(1), i32(1), i32(1), f32(1))
	}
	return nil
}

// cudaSeqHost is the host side of a model whose first layer is an
// embedding: the token index of the batch's B·T positions (a tokenIndex
// of one token per row: token v's rows, in example then position order,
// with inv 1 at every non-padding row, for embed_acc) and, for a
// NextToken model, the layers' input and the targets split from each
// example's T+1 ids (Workspace.loadSequences).
type cudaSeqHost struct {
	T, V int
	next bool
	idx  tokenIndex
	ids  []float32    // [maxB·T], NextToken only
	tgt  []int32      // [maxB·T], NextToken only
	dtgt cu.DevicePtr // int32 [maxB·T], NextToken only
	maxB int
}

func newCUDASeqHost(m *Model, ly *seqEmbed, maxB int) *cudaSeqHost {
	h := &cudaSeqHost{T: ly.T, V: ly.V, next: m.seqT > 0, idx: newTokenIndex(1, ly.V, maxB*ly.T), maxB: maxB}
	if h.next {
		h.ids = make([]float32, maxB*ly.T)
		h.tgt = make([]int32, maxB*ly.T)
	}
	return h
}

// alloc allocates the targets' device buffer (NextToken) with a.
func (h *cudaSeqHost) alloc(a func(*cu.DevicePtr, int) error) error {
	if !h.next {
		return nil
	}
	return a(&h.dtgt, 4*h.maxB*h.T)
}

// load uploads B examples x (checked) as the layers' input act[0], the
// token index into the embedding's buffers and, for NextToken, the
// targets.
func (h *cudaSeqHost) load(e *cudaEngine, x []float32, B int) error {
	T, n := h.T, B*h.T
	ids := x[:n]
	if h.next {
		for i := 0; i < B; i++ {
			ex := x[i*(T+1) : (i+1)*(T+1)]
			copy(h.ids[i*T:(i+1)*T], ex[:T])
			for t, v := range ex[1:] {
				h.tgt[i*T+t] = int32(v)
			}
		}
		ids = h.ids[:n]
		if err := htod(h.dtgt, h.tgt[:n]); err != nil {
			return err
		}
	}
	h.idx.build(ids, n)
	s := &e.lb[0]
	return errors.Join(htod(e.act[0], ids), htod(s.off, h.idx.off), htod(s.ex, h.idx.ex[:h.idx.off[h.V]]),
		htod(s.inv, h.idx.inv[:n]))
}

// lossGrad runs the loss on the last unit's output (the logits) for B
// examples: per-example losses and correct flags into e.loss and
// e.correct (per position for NextToken) and, if dz is not 0, the logits'
// gradient times scale (softmax_xent or token_xent).
func (e *cudaEngine) lossGrad(B int, dz cu.DevicePtr, scale float32) error {
	m, k := e.m, &e.d.k
	logits := e.act[len(e.ly)]
	if m.seqT == 0 {
		return launch1(k.softmaxXent, B, i32(B), i32(m.classes), ptr(logits), ptr(e.y), ptr(dz), f32(scale),
			ptr(e.loss), ptr(e.correct))
	}
	T := m.seqT
	return launch1(k.tokenXent, B*T, i32(B), i32(T), i32(m.classes), ptr(logits), ptr(e.seq.dtgt), ptr(dz), f32(scale),
		ptr(e.loss), ptr(e.correct))
}

// cudaLoss accumulates lossGrad's results over batches: mean, the sum over
// examples of each example's loss (for NextToken its mean over its
// targets: nextTokenXent's sum); total, the sum over all targets (the
// same for the softmax cross-entropy); correct; tokens, the number of
// targets (0 for the softmax cross-entropy).
type cudaLoss struct {
	mean, total     float64
	correct, tokens int
}

// batchLoss downloads lossGrad's results for B examples and adds them to
// r, example by example in order (the correct flags only if eval).
func (e *cudaEngine) batchLoss(B int, eval bool, r *cudaLoss) error {
	T := max(e.m.seqT, 1)
	n := B * T
	if err := dtoh(e.hloss[:n], e.loss); err != nil {
		return err
	}
	if eval {
		if err := dtoh(e.hcorr[:n], e.correct); err != nil {
			return err
		}
	}
	if e.m.seqT == 0 {
		for i := 0; i < B; i++ {
			r.mean += e.hloss[i]
			r.total += e.hloss[i]
			if eval {
				r.correct += int(e.hcorr[i])
			}
		}
		return nil
	}
	for i := 0; i < B; i++ {
		var sum float64
		nt := 0
		for q := i * T; q < (i+1)*T; q++ {
			if e.seq.tgt[q] < 0 {
				continue
			}
			nt++
			sum += e.hloss[q]
			if eval {
				r.correct += int(e.hcorr[q])
			}
		}
		r.tokens += nt
		r.total += sum
		if nt > 0 {
			r.mean += sum / float64(nt)
		}
	}
	return nil
}

package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// conv is a 2-D convolution, computed as a GEMM on the unfolded input
// (im2col): cols [B·T, K] with T = Ho·Wo output positions and K = k·k·C,
// out [B·T, O] = cols · Wᵀ + b. The parameter W is [O, C, kh, kw]
// (PyTorch's order); internally it is permuted to [O, kh, kw, C] so that
// unfolding a channels-last input copies contiguous runs.
//
// Example i's weight gradient is Gᵢ = Dᵢᵀ Aᵢ with Dᵢ [T, O] its output
// gradients and Aᵢ [T, K] its unfolded input, so
// ‖Gᵢ‖² = Σ_{t,s} (Aᵢ Aᵢᵀ)_{ts} (Dᵢ Dᵢᵀ)_{ts} (ghost norm, Li et al. 2022
// §4.1, cost ~T²(K+O)) or directly ‖Dᵢᵀ Aᵢ‖² (materialized, cost ~T·O·K);
// ghost selects the first.
//
// noBias leaves out the bias, for a linear layer at T positions without
// one (seqLinear; conv2d always has a bias): the bias terms below then
// drop out, or are charged as over-estimates where noted.
type conv struct {
	c, h, w, o, k, s, p, ho, wo int
	T, K                        int
	ghost                       bool
	noBias                      bool
}

// biasCol is the constant column that Ã = [A 1] appends to the unfolded
// input for the bias: 1, or 0 without a bias.
func (l *conv) biasCol() float64 {
	if l.noBias {
		return 0
	}
	return 1
}

// newConv checks a conv2d layer spec against its input shape and picks
// the per-example norm strategy.
func newConv(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if len(in) != 3 {
		return nil, errors.New("conv2d needs a [C, H, W] input")
	}
	if ls.Out < 1 || ls.Kernel < 1 || ls.Stride < 1 || ls.Pad < 0 || ls.Pad >= ls.Kernel {
		return nil, fmt.Errorf("need out ≥ 1, kernel ≥ 1, stride ≥ 1, 0 ≤ pad < kernel (got out %d kernel %d stride %d pad %d)", ls.Out, ls.Kernel, ls.Stride, ls.Pad)
	}
	c, h, w := in[0], in[1], in[2]
	if h+2*ls.Pad < ls.Kernel || w+2*ls.Pad < ls.Kernel {
		return nil, fmt.Errorf("kernel %d larger than padded input %d×%d", ls.Kernel, h+2*ls.Pad, w+2*ls.Pad)
	}
	ho := (h+2*ls.Pad-ls.Kernel)/ls.Stride + 1
	wo := (w+2*ls.Pad-ls.Kernel)/ls.Stride + 1
	K := shapeSize([]int{c, ls.Kernel, ls.Kernel})
	if K < 1 || shapeSize([]int{ls.Out, K}) < 1 || shapeSize([]int{ho, wo, K}) < 1 {
		return nil, errors.New("layer too large")
	}
	cv := &conv{c: c, h: h, w: w, o: ls.Out, k: ls.Kernel, s: ls.Stride, p: ls.Pad, ho: ho, wo: wo, T: ho * wo, K: K}
	cv.ghost = ghostCheaper(cv.T, cv.K, cv.o)
	return cv, nil
}

// ghostCheaper picks the per-example norm strategy of a weight applied at
// T positions (K inputs, O outputs; Li et al. 2022, "Large Language Models
// Can Be Strong Differentially Private Learners", §4; Bu et al. 2023,
// "Differentially Private Optimization on Large Model at Small Cost",
// "book-keeping", mixed ghost clipping). Per example, the ghost norm costs
// ~T²(K+O) (two T×T Gram matrices) and its share of the clipped sum's
// product ~T·O·K; materializing costs ~T·O·K for the per-example gradient,
// which the clipped sum then adds (~O·K). It picks the cheaper, unless
// storing the B per-example gradients would take more than twice the
// memory of the layer's unfolded input and output gradients.
func ghostCheaper(T, K, O int) bool {
	return T*T*(K+O) < O*K || O*K > 2*T*(K+O)
}

// convState is a convolution's kernels with one workspace's buffers.
type convState struct {
	l           *conv
	cols, dcols []float32
	// wk is the weights in [O, kh, kw, C] order as forward left them for
	// backward: w itself for a 1×1 convolution (the two orders agree;
	// no copy of a frozen or trainable weight per workspace), else wp.
	wk, wp []float32
	// The gradient buffers, allocated on the first paramGrad or accGrad
	// (a frozen layer never needs them): the weight gradient in internal
	// order (gw), per-chunk sums and accGrad's sum in public order.
	gw       []float32
	part     [gradChunks][]float32
	part64   [gradChunks][]float64 // accGrad's per-chunk sums, [O·K]
	pub64    []float64             // accGrad's sum in public order, [O·K]
	scratch  [][]float32           // per worker: [T·T]·2 (ghost only)
	bsum     [][]float64           // per worker [O]
	rowNorms [][]float64           // per worker: αₜ then βₜ, [2T]
	piece    [][]float32           // per worker, materializing with T > normRows: [O·K]
	piece64  [][]float64           // per worker, likewise: [O·K]
	// gi holds, when materializing, each example's weight gradient
	// fl(Dᵢᵀ Aᵢ) [B, O·K] from bound, which accGrad sums; allocated on
	// first use.
	gi []float32
}

func (l *conv) outShape() []int { return []int{l.o, l.ho, l.wo} }
func (l *conv) paramShapes() []paramShape {
	return []paramShape{{"weight", []int{l.o, l.c, l.k, l.k}}, {"bias", []int{l.o}}}
}
func (l *conv) init(w []float32, rng *rand.Rand) {
	uniformInit(w, 1/math.Sqrt(float64(l.K)), rng)
}
func (l *conv) newState(maxB, workers int, needDin bool) layerState {
	st := &convState{l: l, cols: make([]float32, maxB*l.T*l.K)}
	if l.k > 1 {
		st.wp = make([]float32, l.o*l.K)
	}
	if needDin {
		st.dcols = make([]float32, maxB*l.T*l.K)
	}
	for range workers {
		if l.ghost {
			st.scratch = append(st.scratch, make([]float32, 2*l.T*l.T))
		}
		st.bsum = append(st.bsum, make([]float64, l.o))
		st.rowNorms = append(st.rowNorms, make([]float64, 2*l.T))
		if !l.ghost && l.T > normRows {
			st.piece = append(st.piece, make([]float32, l.o*l.K))
			st.piece64 = append(st.piece64, make([]float64, l.o*l.K))
		}
	}
	return st
}

// gradBuffers allocates the buffers paramGrad and accGrad use, once.
func (s *convState) gradBuffers() {
	if s.pub64 != nil {
		return
	}
	n := s.l.o * s.l.K
	s.gw = make([]float32, n)
	for c := range s.part {
		s.part[c] = make([]float32, n)
		s.part64[c] = make([]float64, n)
	}
	s.pub64 = make([]float64, n)
}

// permute copies the weights from the public [O, C, kh, kw] order to the
// internal [O, kh, kw, C] order (inverse: unpermute), matching the
// channels-last unfolded input whose patch rows are then contiguous runs.
func (l *conv) permute(dst, w []float32) {
	kk := l.k * l.k
	for o := 0; o < l.o; o++ {
		src, d := w[o*l.K:(o+1)*l.K], dst[o*l.K:(o+1)*l.K]
		for c := 0; c < l.c; c++ {
			for r := 0; r < kk; r++ {
				d[r*l.c+c] = src[c*kk+r]
			}
		}
	}
}

func (l *conv) unpermute(dst, w []float32) { unpermute(l, dst, w) }

// unpermute64 is unpermute for float64 values.
func (l *conv) unpermute64(dst, w []float64) { unpermute(l, dst, w) }

func unpermute[F float32 | float64](l *conv, dst, w []F) {
	kk := l.k * l.k
	for o := 0; o < l.o; o++ {
		src, d := w[o*l.K:(o+1)*l.K], dst[o*l.K:(o+1)*l.K]
		for c := 0; c < l.c; c++ {
			for r := 0; r < kk; r++ {
				d[c*kk+r] = src[r*l.c+c]
			}
		}
	}
}

// span returns, for an output column ow, the first input column of the
// window and the range [lo, hi) of kernel columns that fall inside the image.
func (l *conv) span(ow int) (w0, lo, hi int) {
	w0 = ow*l.s - l.p
	return w0, max(0, -w0), min(l.k, l.w-w0)
}

// im2col unfolds one example (H, W, C layout) into cols [T, K], patch
// order (kh, kw, c), zero outside the image.
func (l *conv) im2col(cols, x []float32) {
	kc := l.k * l.c
	r := 0
	for oh := 0; oh < l.ho; oh++ {
		for ow := 0; ow < l.wo; ow++ {
			w0, lo, hi := l.span(ow)
			for kh := 0; kh < l.k; kh++ {
				row := cols[r : r+kc]
				r += kc
				hh := oh*l.s - l.p + kh
				if hh < 0 || hh >= l.h || lo >= hi {
					clear(row)
					continue
				}
				clear(row[:lo*l.c])
				base := (hh*l.w + w0) * l.c
				copy(row[lo*l.c:hi*l.c], x[base+lo*l.c:base+hi*l.c])
				clear(row[hi*l.c:])
			}
		}
	}
}

// col2im is the adjoint of im2col: it accumulates cols into dx.
func (l *conv) col2im(dx, cols []float32) {
	clear(dx)
	kc := l.k * l.c
	r := 0
	for oh := 0; oh < l.ho; oh++ {
		for ow := 0; ow < l.wo; ow++ {
			w0, lo, hi := l.span(ow)
			for kh := 0; kh < l.k; kh++ {
				row := cols[r : r+kc]
				r += kc
				hh := oh*l.s - l.p + kh
				if hh < 0 || hh >= l.h || lo >= hi {
					continue
				}
				base := (hh*l.w + w0) * l.c
				d := dx[base+lo*l.c : base+hi*l.c]
				for j, v := range row[lo*l.c : hi*l.c] {
					d[j] += v
				}
			}
		}
	}
}

func (s *convState) forward(p *pass, w, in, out []float32) {
	l := s.l
	nin, tk := l.h*l.w*l.c, l.T*l.K
	p.parFor(p.B, tk, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			l.im2col(s.cols[i*tk:(i+1)*tk], in[i*nin:(i+1)*nin])
		}
	})
	s.wk = w[:l.o*l.K]
	if l.k > 1 {
		l.permute(s.wp, s.wk)
		s.wk = s.wp
	}
	b := w[l.o*l.K:] // empty without a bias
	rows := p.B * l.T
	p.be.Sgemm(false, true, rows, l.o, l.K, 1, s.cols, l.K, s.wk, l.K, 0, out, l.o)
	for r := 0; r < rows && !l.noBias; r++ {
		row := out[r*l.o : (r+1)*l.o]
		for o, bv := range b {
			row[o] += bv
		}
	}
}

// backward uses the weights forward left in the state (wk).
func (s *convState) backward(p *pass, w, in, out, dout, din []float32) {
	l := s.l
	if din == nil {
		return
	}
	p.be.Sgemm(false, false, p.B*l.T, l.K, l.o, 1, dout, l.o, s.wk, l.K, 0, s.dcols, l.K)
	nin, tk := l.h*l.w*l.c, l.T*l.K
	p.parFor(p.B, tk, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			l.col2im(din[i*nin:(i+1)*nin], s.dcols[i*tk:(i+1)*tk])
		}
	})
}

// bound: example i's gradient is Gᵢ = Dᵢᵀ Ãᵢ (weights and bias, Ãᵢ = [Aᵢ 1]),
// with rows dₜ of Dᵢ (‖dₜ‖ = βₜ) and aₜ of Aᵢ (‖aₜ‖ = αₜ, ‖ãₜ‖ = √(αₜ²+1)),
// and ρᵢ = Σₜ βₜ‖ãₜ‖ ≥ ‖Gᵢ‖. Without a bias Ãᵢ = Aᵢ: ‖ãₜ‖ = αₜ, and n
// has no bias term; the bias's shares in the formulas below are then
// over-estimates, which is safe. With the ghost norm, the float32 Gram
// matrices Ĝa ≈ AᵢAᵢᵀ and Ĝd ≈ DᵢDᵢᵀ carry entrywise errors of at most
// γ_K(u32)·αₜαₛ and γ_O(u32)·βₜβₛ (plus K·eta32 and O·eta32 from
// underflow), and the float64 sum of their products a relative
// φ = γ_{T²}(u64). Writing ĜaĜd − GaGd = (Ĝa−Ga)Ĝd + Ga(Ĝd−Gd), with
// |Ga| ≤ |Ĝa| + γ_K·αₜαₛ, the computed n̂ (bias included) satisfies
//
//	|n̂ − ‖Gᵢ‖²| ≤ γ_K·αᵀ|Ĝd|α + γ_O·βᵀ|Ĝa|β + φ·Σ|ĜaĜd|
//	             + (γ_Kγ_O + 4φ)·ρᵢ² + 2·eta32·(K·Σ|Ĝd| + O·Σ|Ĝa|) + …
//
// (4φρᵢ² covers the float64 bias), evaluated from the Gram matrices in
// O(T²) per example, without branches; in the worst case it is κ·ρᵢ² with
// κ = γ_K + γ_O + γ_Kγ_O + 5φ. The bound is max(n̂, 0) plus this error;
// an n̂ below minus the error cannot happen in this arithmetic and makes
// the bound NaN (the example is dropped). accGrad's shares are then those
// of linear, with ρᵢ summed over positions (blocks of blockRows rows).
//
// When materializing, Ĝᵢ = Dᵢᵀ Aᵢ is formed by float32 products over pieces
// of at most R = normRows rows, added in float64 and rounded to float32
// once, so
//
//	‖Ĝᵢ − Dᵢᵀ Aᵢ‖ ≤ (γ_R(u32) + φ)(1+2u32)·ρᵢ + u32·‖Ĝᵢ‖ + eta32·√(O·K)·(T+1).
//
// The bound takes ‖Ĝᵢ‖ (and the float64 bias) as the norm and charges the
// distance to Gᵢ as a share: accGrad adds the stored cᵢ·Ĝᵢ (exact float64
// products), so example i's realized term is within cᵢ·share of cᵢGᵢ and
// its norm within cᵢ·N.
//
// Relative bound: the clip norm exceeds ‖Gᵢ‖ by at most a relative
// κ·(ρᵢ/‖Gᵢ‖)²/2 + γ_{blockRows}·ρᵢ/‖Gᵢ‖ (ghost, worst case) or
// γ_R·ρᵢ/‖Gᵢ‖ + 1e-6 (materialized): 3e-5 or less on typical examples of the
// cnn preset, where ρᵢ/‖Gᵢ‖ is about 5 to 10. Only cancellation across
// positions (ρᵢ ≫ ‖Gᵢ‖) over-clips noticeably, which is safe.
func (s *convState) bound(p *pass, in, out, dout []float32, b clipBounds) {
	l := s.l
	T, K, O := l.T, l.K, l.o
	k := l.boundConsts()
	if !l.ghost && s.gi == nil {
		s.gi = make([]float32, len(s.cols)/K*O/T*K)
	}
	p.par(p.B, func(wk, lo, hi int) {
		bs := s.bsum[wk]
		al, be := s.rowNorms[wk][:T], s.rowNorms[wk][T:]
		for i := lo; i < hi; i++ {
			D := dout[i*T*O : (i+1)*T*O]
			A := s.cols[i*T*K : (i+1)*T*K]
			// ρ̃ = Σₜ βₜ‖ãₜ‖ (≥ ρ = Σₜ βₜαₜ), and Σ‖ãₜ‖, Σβₜ.
			var st convStats
			for t := 0; t < T; t++ {
				a2 := sumSq(A[t*K : (t+1)*K])
				al[t] = math.Sqrt(a2) * k.up
				be[t] = math.Sqrt(sumSq(D[t*O:(t+1)*O])) * k.up
				at := math.Sqrt(a2 + l.biasCol())
				st.rho += be[t] * at
				st.sat += at
				st.sb += be[t]
			}
			if !l.noBias {
				colSum(bs, D, T, O)
				for _, v := range bs {
					st.n += v * v
				}
			}
			if l.ghost {
				ga, gd := s.scratch[wk][:T*T], s.scratch[wk][T*T:]
				p.be.Sgemm(false, true, T, T, K, 1, A, K, A, K, 0, ga, T)
				p.be.Sgemm(false, true, T, T, O, 1, D, O, D, O, 0, gd, T)
				// n̂ and, from the same entries, the terms of its error.
				for t := 0; t < T; t++ {
					at, bt := al[t], be[t]
					for u, av := range ga[t*T : (t+1)*T] {
						a, d := float64(av), float64(gd[t*T+u])
						ad := a * d
						st.n += ad
						st.eP += math.Abs(ad)
						st.eK += at * al[u] * math.Abs(d)
						st.eO += math.Abs(a) * bt * be[u]
						st.sa += math.Abs(a)
						st.sd += math.Abs(d)
					}
				}
			} else {
				gi := s.gi[i*O*K : (i+1)*O*K]
				l.product(p, s, gi, D, A, wk)
				st.n += sumSq(gi)
			}
			l.boundExample(b, i, &k, &st)
		}
	})
}

// convStats are the sums of one example that conv's bound formula takes,
// each accumulated in float64 in any order (boundSlack covers it), from
// αₜ = √(Σ aₜ²)·up and βₜ = √(Σ dₜ²)·up (up = convConsts.up):
//
//	rho = Σₜ βₜ√(αₜ²+1) (with αₜ before up), sat = Σₜ √(αₜ²+1), sb = Σₜ βₜ
//	      (αₜ² in place of αₜ²+1 without a bias)
//	n   = Σₒ(Σₜ dₜₒ)² (the bias, if any) + n̂ (ghost: Σ ĜaĜd) or ‖Ĝᵢ‖²
//	      (materialized)
//	eK  = Σₜᵤ αₜαᵤ|Ĝd|, eO = Σₜᵤ |Ĝa|βₜβᵤ, eP = Σₜᵤ |ĜaĜd|,
//	sa  = Σ|Ĝa|, sd = Σ|Ĝd|   (ghost only)
//
// The CPU's bound computes them, and so do the GPU engine's kernels.
type convStats struct {
	rho, sat, sb, n    float64
	eK, eO, eP, sa, sd float64
}

// convConsts are the constants of conv's bound formula for the layer's shape.
type convConsts struct {
	up, phi, gK, gO, gM, gR, lam float64
	fK, fO, fT, sO, sOK, sOKT    float64
}

func (l *conv) boundConsts() convConsts {
	T, K, O := l.T, l.K, l.o
	gR := gamma(blockRows, u32)
	k := convConsts{
		up:  boundSlack(T*T + T + K + O),
		phi: gamma(T*T+T+K+O+16, u64),
		gK:  gamma(K, u32), gO: gamma(O, u32),
		gM:  gamma(l.pieceRows(), u32),
		gR:  gR,
		lam: u32 + (1+u32)*(gR+3*accGamma*(1+gR)),
		fK:  float64(K), fO: float64(O), fT: float64(T),
	}
	k.sO, k.sOK = math.Sqrt(k.fO), math.Sqrt(k.fO*k.fK)
	k.sOKT = k.sOK * k.fT
	return k
}

// boundExample adds example i's bounds from its sums s: the one place the
// convolution's bound formula (see bound) lives, for the CPU and the GPU
// engine.
func (l *conv) boundExample(b clipBounds, i int, k *convConsts, s *convStats) {
	up := k.up
	rho, sat, sb, n := s.rho*up, s.sat*up, s.sb*up, s.n
	var sq float64
	if l.ghost {
		err := (k.gK*s.eK+k.gO*s.eO+k.phi*s.eP)*up + (k.gK*k.gO+4*k.phi)*rho*rho +
			2*eta32*(k.fK*s.sd+k.fO*s.sa+k.fK*k.fO*k.fT*k.fT*eta32)*up
		if n < -err {
			sq = math.NaN()
		} else {
			sq = (max(n, 0) + err) * up
		}
		b.share[i] += k.lam * rho
		b.floor[i] += eta32 * (k.sO*sat*(1+k.gR) + k.sOKT) * up
	} else {
		g := math.Sqrt(n) * (1 + 2*u32) * up
		sq = g * g
		// The product's distance to the exact gradient; then two
		// float64 sums of exact products (weights) and the
		// float32 scaling of D and two float64 sums (bias).
		e := ((k.gM+k.phi)*(1+2*u32)*rho + eta32*(k.sOKT+k.sOK)) * up
		b.share[i] += e + 2*accGamma*(g+e) + (u32+2*accGamma*(1+u32))*sb
		b.floor[i] += eta32 * k.sO * k.fT * (1 + 2*accGamma) * up
	}
	b.sq[i] += sq
}

// normRows bounds the rows of one float32 product when materializing an
// example's weight gradient: pieces of at most normRows output positions
// are added in float64, so the product's error is γ_{normRows}(u32)·ρᵢ
// rather than γ_T(u32)·ρᵢ.
const normRows = 64

// pieceRows returns the rows of each piece of a materialized product:
// T split evenly into ⌈T/normRows⌉ pieces.
func (l *conv) pieceRows() int {
	n := (l.T + normRows - 1) / normRows
	return (l.T + n - 1) / n
}

// product writes example i's weight gradient Dᵀ A [O, K] (internal order)
// into dst: one float32 product if T ≤ normRows, else pieces of pieceRows
// rows added in float64 (worker wk's buffers) and rounded once.
func (l *conv) product(p *pass, s *convState, dst, D, A []float32, wk int) {
	T, K := l.T, l.K
	if T <= normRows {
		l.sgemmTN(p, dst, D, A, T)
		return
	}
	piece, acc := s.piece[wk], s.piece64[wk]
	clear(acc)
	R := l.pieceRows()
	for t0 := 0; t0 < T; t0 += R {
		rows := min(R, T-t0)
		l.sgemmTN(p, piece, D[t0*l.o:], A[t0*K:], rows)
		for j, v := range piece {
			acc[j] += float64(v)
		}
	}
	for j, v := range acc {
		dst[j] = float32(v)
	}
}

// productCols bounds the columns of one per-example product. These
// products already run on the workers p.par spreads the examples over; the
// pure-Go back end would split a wider one over goroutines again (from
// four 64×64 blocks of the result), which allocates per example and gains
// nothing. Each result element is summed in the same order either way.
const productCols = 64

// sgemmTN writes Dᵀ A [O, K] over the first rows rows of D [·, O] and
// A [·, K] into dst, in column pieces of at most productCols.
func (l *conv) sgemmTN(p *pass, dst, D, A []float32, rows int) {
	O, K := l.o, l.K
	for k0 := 0; k0 < K; k0 += productCols {
		n := min(productCols, K-k0)
		p.be.Sgemm(true, false, O, n, rows, 1, D, O, A[k0:], K, 0, dst[k0:], K)
	}
}

// accGrad sums blocks of blockRows rows (output positions of consecutive
// examples) with one float32 product each; block j goes to chunk
// j mod gradChunks, each chunk adds its blocks in order into its own
// float64 sum, and the chunks are added in order: the result depends on
// neither GOMAXPROCS nor the batch size beyond the last block.
func (s *convState) accGrad(p *pass, acc []float64, dst []float32, in, out, dout []float32) {
	l := s.l
	s.gradBuffers()
	T, K, O := l.T, l.K, l.o
	if !l.noBias {
		bs := s.bsum[0]
		colSum(bs, dout, p.B*T, O)
		put64(acc[O*K:], dst[O*K:], bs, p.fresh, p.final)
	}
	sum, pub := s.part64[0], s.pub64
	if !l.ghost {
		// Σᵢ cᵢ·Ĝᵢ over the stored per-example products, in example
		// order for every element (clearExample zeroed a dropped
		// example's Ĝᵢ, which may have held NaN).
		OK := O * K
		p.parFor(OK, p.B, func(_, lo, hi int) {
			acc := sum[lo:hi]
			clear(acc)
			for i, c := range p.coef[:p.B] {
				cf := float64(c)
				for j, v := range s.gi[i*OK+lo : i*OK+hi] {
					acc[j] += cf * float64(v)
				}
			}
		})
		l.unpermute64(pub, sum)
		put64(acc[:OK], dst[:OK], pub, p.fresh, p.final)
		return
	}
	R := p.B * T
	nb := (R + blockRows - 1) / blockRows
	p.par(gradChunks, func(_, lo, hi int) {
		for c := lo; c < hi; c++ {
			part, sum := s.part[c], s.part64[c]
			clear(sum)
			for j := c; j < nb; j += gradChunks {
				r0 := j * blockRows
				rows := min(blockRows, R-r0)
				p.be.Sgemm(true, false, O, K, rows, 1, dout[r0*O:], O, s.cols[r0*K:], K, 0, part, K)
				for k, v := range part {
					sum[k] += float64(v)
				}
			}
		}
	})
	for _, part := range s.part64[1:] {
		for k, v := range part {
			sum[k] += v
		}
	}
	l.unpermute64(pub, sum)
	put64(acc[:O*K], dst[:O*K], pub, p.fresh, p.final)
}

func (s *convState) clearExample(i int, in, dout []float32) {
	l := s.l
	clear(s.cols[i*l.T*l.K : (i+1)*l.T*l.K])
	clear(dout[i*l.T*l.o : (i+1)*l.T*l.o])
	if s.gi != nil {
		clear(s.gi[i*l.o*l.K : (i+1)*l.o*l.K])
	}
}

// gradChunks is the fixed number of partial products a convolution's
// weight gradient is split into (by examples), so that the long reduction
// over B·T rows runs on several cores; partial results are summed in chunk
// order, so the result does not depend on the number of workers.
const gradChunks = 4

func (s *convState) paramGrad(p *pass, dw, in, out, dout []float32, alpha float32) {
	l := s.l
	s.gradBuffers()
	p.par(gradChunks, func(_, lo, hi int) {
		for c := lo; c < hi; c++ {
			e0, e1 := c*p.B/gradChunks, (c+1)*p.B/gradChunks
			r0, rows := e0*l.T, (e1-e0)*l.T
			p.be.Sgemm(true, false, l.o, l.K, rows, alpha, dout[r0*l.o:], l.o, s.cols[r0*l.K:], l.K, 0, s.part[c], l.K)
		}
	})
	copy(s.gw, s.part[0])
	for _, part := range s.part[1:] {
		for j, v := range part {
			s.gw[j] += v
		}
	}
	l.unpermute(dw[:l.o*l.K], s.gw)
	if l.noBias {
		return
	}
	rows := p.B * l.T
	bs := s.bsum[0]
	colSum(bs, dout, rows, l.o)
	db := dw[l.o*l.K:]
	for o, v := range bs {
		db[o] = float32(float64(alpha) * v)
	}
}

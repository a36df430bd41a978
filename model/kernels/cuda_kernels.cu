// CUDA kernels of the GPU engine (model/cuda_engine.go, build tag "cuda").
//
// Generated into cuda_kernels.ptx by `go generate ./model/kernels`
// (gen_ptx.sh), which runs
//
//	nvcc -ptx -arch=compute_80 -O3 -o cuda_kernels.ptx cuda_kernels.cu
//
// and prepends the SHA-256 of this file; TestCUDAPTXMatchesSource (no GPU
// needed) checks that the committed PTX was generated from this source.
// compute_80 PTX runs on every GPU of compute capability 8.0 or newer
// (A100, H100, ...): the driver compiles it for the device at load time.
//
// Numerics. Built without --use_fast_math: float32 operations are IEEE
// round-to-nearest with subnormals kept (no .ftz), division and square root
// correctly rounded; fused multiply-adds are allowed (the error bounds in
// model/bound.go hold with or without them). No kernel uses atomics in a
// reduction that decides bits: every output element is summed by one
// thread, or by a fixed tree of one block, in an order fixed by the shapes,
// so results are deterministic (the same bits on every run on the same
// GPU model and driver).

#include <stdint.h>

// ------------------------------------------------------------------ GEMM
//
// Row-major C = alpha·op(A)·op(B) + beta·C with op(A) m×k, op(B) k×n (the
// contract of model.Backend's Sgemm). Each thread computes a TM×TN tile of C
// as TM·TN sequential float32 sums along k (fused multiply-adds), so every
// element's error is within γ_k·Σ|a·b| (Higham §3.5), in an order that
// depends on k only. beta = 0 does not read C.

#define BM 64
#define BN 64
#define BK 16
#define TM 4
#define TN 4
// 16×16 threads; thread (ty, tx) owns rows ty + 16·r and columns tx + 16·c.

template <bool TA, bool TB>
__device__ __forceinline__ void load_tiles(float (*As)[BM + 1], float (*Bs)[BN + 1], const float *a, int lda,
                                           const float *b, int ldb, int m, int n, int k, int m0, int n0, int k0,
                                           int tid) {
#pragma unroll
	for (int r = 0; r < (BM * BK) / 256; r++) {
		int idx = tid + 256 * r;
		int row, col; // row in [0, BM), col in [0, BK)
		if (TA) {
			row = idx % BM;
			col = idx / BM;
		} else {
			row = idx / BK;
			col = idx % BK;
		}
		int gi = m0 + row, gp = k0 + col;
		float v = 0.f;
		if (gi < m && gp < k) v = TA ? a[(size_t)gp * lda + gi] : a[(size_t)gi * lda + gp];
		As[col][row] = v;
	}
#pragma unroll
	for (int r = 0; r < (BN * BK) / 256; r++) {
		int idx = tid + 256 * r;
		int col, p; // col in [0, BN), p in [0, BK)
		if (TB) {
			col = idx / BK;
			p = idx % BK;
		} else {
			col = idx % BN;
			p = idx / BN;
		}
		int gj = n0 + col, gp = k0 + p;
		float v = 0.f;
		if (gj < n && gp < k) v = TB ? b[(size_t)gj * ldb + gp] : b[(size_t)gp * ldb + gj];
		Bs[p][col] = v;
	}
}

// Batches over blockIdx.z: block z multiplies the k-range
// [z·kblock, min(k, (z+1)·kblock)) of A + z·sa and B + z·sb into C + z·sc:
// with sa = sb = 0, the per-block products of accgrad (see accGrad in
// model/cuda_engine.go); with kblock = 0 (no split of k), a strided batch of
// independent products (a convolution's per-example Gram matrices);
// kblock = k, one z and zero strides for a plain product.
#define KBATCH()                                                                                                       \
	int kstart = blockIdx.z * kblock;                                                                                \
	if (kblock > 0) k = min(kblock, k - kstart);                                                                     \
	a += (TA ? (size_t)kstart * lda : (size_t)kstart) + (size_t)blockIdx.z * sa;                                     \
	b += (TB ? (size_t)kstart : (size_t)kstart * ldb) + (size_t)blockIdx.z * sb;                                     \
	c += (size_t)blockIdx.z * sc;

template <bool TA, bool TB>
__device__ void sgemm_body(int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                           float beta, float *c, int ldc, int kblock, size_t sc, size_t sa, size_t sb) {
	KBATCH()
	__shared__ float As[BK][BM + 1];
	__shared__ float Bs[BK][BN + 1];
	int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
	int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
	float acc[TM][TN];
#pragma unroll
	for (int i = 0; i < TM; i++)
#pragma unroll
		for (int j = 0; j < TN; j++) acc[i][j] = 0.f;
	for (int k0 = 0; k0 < k; k0 += BK) {
		load_tiles<TA, TB>(As, Bs, a, lda, b, ldb, m, n, k, m0, n0, k0, tid);
		__syncthreads();
		int kk = min(BK, k - k0);
		for (int p = 0; p < kk; p++) {
			float av[TM], bv[TN];
#pragma unroll
			for (int i = 0; i < TM; i++) av[i] = As[p][ty + 16 * i];
#pragma unroll
			for (int j = 0; j < TN; j++) bv[j] = Bs[p][tx + 16 * j];
#pragma unroll
			for (int i = 0; i < TM; i++)
#pragma unroll
				for (int j = 0; j < TN; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
		}
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < TM; i++) {
		int gi = m0 + ty + 16 * i;
		if (gi >= m) continue;
#pragma unroll
		for (int j = 0; j < TN; j++) {
			int gj = n0 + tx + 16 * j;
			if (gj >= n) continue;
			float *cp = &c[(size_t)gi * ldc + gj];
			float v = alpha * acc[i][j];
			if (beta != 0.f) v += beta * *cp;
			*cp = v;
		}
	}
}

// sgemm128: the same product on 128×128 tiles of C (256 threads, each an
// 8×8 tile: rows ty·4 + i and 64 + ty·4 + i, columns likewise, so that the
// 16-byte shared-memory reads are free of bank conflicts), BKT (8 or 16)
// values of k per slab, with the next slab loaded into registers while the
// current one is multiplied, and two shared-memory buffers. Each thread
// loads BKT/2 elements of each operand per slab, consecutive in memory
// (along k for A and for a transposed B, along the rows of a transposed A
// and the columns of B); with VEC they are loaded, and C's columns stored,
// four at a time as float4 — the host selects VEC only when every leading
// dimension, stride, the edges that are read in fours and the pointers
// are multiples of 4 floats (gemmArgs.aligned in model/cuda_launch.go), so that a float4 is
// either wholly inside the operand or wholly outside it. Every element is
// the same sequential fused multiply-add chain along k as in sgemm_body
// (zero padding adds exact zeros), so all these kernels give the same
// bits; the host picks one by the shape alone.
template <bool TA, bool TB, int BKT, bool VEC>
__device__ void sgemm128_body(int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                              float beta, float *c, int ldc, int kblock, size_t sc, size_t sa, size_t sb) {
	KBATCH()
	constexpr int LPT = BKT / 2;      // elements of each operand a thread loads per slab
	constexpr int SPAN = 128 / LPT;   // threads along a contiguous row of 128
	__shared__ __align__(16) float As[2][BKT][128];
	__shared__ __align__(16) float Bs[2][BKT][128];
	int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
	int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
	// This thread's first element of each operand: (arow, ap) of A,
	// (bp, bcol) of B; the LPT elements are consecutive along the
	// contiguous direction.
	int arow, ap, bcol, bp;
	if (TA) {
		ap = tid / SPAN;
		arow = (tid % SPAN) * LPT;
	} else {
		arow = tid / 2;
		ap = (tid % 2) * LPT;
	}
	if (TB) {
		bcol = tid / 2;
		bp = (tid % 2) * LPT;
	} else {
		bp = tid / SPAN;
		bcol = (tid % SPAN) * LPT;
	}
	float ra[LPT], rb[LPT];
	// load(k0): this thread's elements of slab k0 into ra, rb (zero
	// outside the operands).
	auto load = [&](int k0) {
		int gi = m0 + arow, gp = k0 + ap;
		const float *pa = TA ? a + (size_t)gp * lda + gi : a + (size_t)gi * lda + gp;
		int gj = n0 + bcol, gq = k0 + bp;
		const float *pb = TB ? b + (size_t)gj * ldb + gq : b + (size_t)gq * ldb + gj;
		if (VEC) {
#pragma unroll
			for (int v = 0; v < LPT / 4; v++) {
				bool in = TA ? (gp < k && gi + 4 * v < m) : (gi < m && gp + 4 * v < k);
				float4 x = in ? *(const float4 *)(pa + 4 * v) : make_float4(0.f, 0.f, 0.f, 0.f);
				ra[4 * v] = x.x, ra[4 * v + 1] = x.y, ra[4 * v + 2] = x.z, ra[4 * v + 3] = x.w;
				in = TB ? (gj < n && gq + 4 * v < k) : (gq < k && gj + 4 * v < n);
				x = in ? *(const float4 *)(pb + 4 * v) : make_float4(0.f, 0.f, 0.f, 0.f);
				rb[4 * v] = x.x, rb[4 * v + 1] = x.y, rb[4 * v + 2] = x.z, rb[4 * v + 3] = x.w;
			}
		} else {
#pragma unroll
			for (int q = 0; q < LPT; q++) {
				bool in = TA ? (gp < k && gi + q < m) : (gi < m && gp + q < k);
				ra[q] = in ? pa[q] : 0.f;
				in = TB ? (gj < n && gq + q < k) : (gq < k && gj + q < n);
				rb[q] = in ? pb[q] : 0.f;
			}
		}
	};
	auto store = [&](int buf) {
#pragma unroll
		for (int q = 0; q < LPT; q++) {
			if (TA)
				As[buf][ap][arow + q] = ra[q];
			else
				As[buf][ap + q][arow] = ra[q];
			if (TB)
				Bs[buf][bp + q][bcol] = rb[q];
			else
				Bs[buf][bp][bcol + q] = rb[q];
		}
	};
	float acc[8][8];
#pragma unroll
	for (int i = 0; i < 8; i++)
#pragma unroll
		for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
	load(0);
	store(0);
	__syncthreads();
	int cur = 0;
	for (int k0 = 0; k0 < k; k0 += BKT) {
		bool next = k0 + BKT < k;
		if (next) load(k0 + BKT);
#pragma unroll
		for (int p = 0; p < BKT; p++) {
			float4 a0 = *(const float4 *)&As[cur][p][ty * 4], a1 = *(const float4 *)&As[cur][p][64 + ty * 4];
			float4 b0 = *(const float4 *)&Bs[cur][p][tx * 4], b1 = *(const float4 *)&Bs[cur][p][64 + tx * 4];
			float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
			float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
			for (int i = 0; i < 8; i++)
#pragma unroll
				for (int j = 0; j < 8; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
		}
		if (next) {
			store(cur ^ 1);
			__syncthreads();
			cur ^= 1;
		}
	}
#pragma unroll
	for (int i = 0; i < 8; i++) {
		int gi = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
		if (gi >= m) continue;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int gj0 = n0 + h * 64 + tx * 4;
			float *cp = &c[(size_t)gi * ldc + gj0];
			if (VEC && gj0 < n) { // n is a multiple of 4: all four columns are in
				float4 v = make_float4(alpha * acc[i][4 * h], alpha * acc[i][4 * h + 1], alpha * acc[i][4 * h + 2],
				                       alpha * acc[i][4 * h + 3]);
				if (beta != 0.f) {
					float4 o = *(const float4 *)cp;
					v.x += beta * o.x, v.y += beta * o.y, v.z += beta * o.z, v.w += beta * o.w;
				}
				*(float4 *)cp = v;
				continue;
			}
#pragma unroll
			for (int j = 0; j < 4; j++) {
				if (gj0 + j >= n) continue;
				float v = alpha * acc[i][4 * h + j];
				if (beta != 0.f) v += beta * cp[j];
				cp[j] = v;
			}
		}
	}
}

#define SGEMM_ARGS                                                                                                     \
	int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c,        \
	    int ldc, int kblock, size_t sc, size_t sa, size_t sb
#define SGEMM_PASS m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, kblock, sc, sa, sb

extern "C" {
__global__ void sgemm_nn(SGEMM_ARGS) { sgemm_body<false, false>(SGEMM_PASS); }
__global__ void sgemm_nt(SGEMM_ARGS) { sgemm_body<false, true>(SGEMM_PASS); }
__global__ void sgemm_tn(SGEMM_ARGS) { sgemm_body<true, false>(SGEMM_PASS); }
__global__ void sgemm_tt(SGEMM_ARGS) { sgemm_body<true, true>(SGEMM_PASS); }
#define SGEMM128(name, ta, tb, bk, vec)                                                                                 \
	__global__ void __launch_bounds__(256, 2) name(SGEMM_ARGS) { sgemm128_body<ta, tb, bk, vec>(SGEMM_PASS); }
SGEMM128(sgemm128_nn, false, false, 8, false)
SGEMM128(sgemm128_nt, false, true, 8, false)
SGEMM128(sgemm128_tn, true, false, 8, false)
// Vectorized (float4 loads and stores), k-slabs of 8 and of 16.
SGEMM128(sgemm128v_nn, false, false, 8, true)
SGEMM128(sgemm128v_nt, false, true, 8, true)
SGEMM128(sgemm128v_tn, true, false, 8, true)
SGEMM128(sgemm128w_nn, false, false, 16, true)
SGEMM128(sgemm128w_nt, false, true, 16, true)
SGEMM128(sgemm128w_tn, true, false, 16, true)

// put applies put32's rule (model/layer.go) to one element: tot is this call's
// sum for the element, acc the float64 accumulator across chunks, dst the
// float32 result.
__device__ __forceinline__ void put(double tot, double *acc, float *dst, int first, int last) {
	if (first && last)
		*dst = (float)tot;
	else if (first)
		*acc = tot;
	else if (last)
		*dst = (float)(*acc + tot);
	else
		*acc += tot;
}

// conv_internal maps index e of a convolution's weight in the public
// [O, C, kk] order to the internal [O, kk, C] order (conv.permute in
// model/conv.go); the identity when c = 0 (a linear layer).
__device__ __forceinline__ size_t conv_internal(size_t e, int c, int kk) {
	if (c == 0) return e;
	size_t K = (size_t)c * kk;
	size_t o = e / K, q = e % K;
	size_t ch = q / kk, r = q % kk;
	return o * K + r * c + ch;
}

// blocks_put sums, per element e of n, the nb float32 block products
// blk[z·n + e'] (z in order) in float64 and puts the total into acc / dst:
// the accumulation of linear.accGrad (float32 products over blocks of
// blockRows rows, each added into a float64 total; linear.bound's λ). e' is
// e, or for a convolution (c > 0) the internal index of public element e.
__global__ void blocks_put(size_t n, int nb, const float *blk, double *acc, float *dst, int first, int last, int c,
                           int kk) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	size_t src = conv_internal(e, c, kk);
	double tot = 0.0;
	for (int z = 0; z < nb; z++) tot += (double)blk[(size_t)z * n + src];
	put(tot, &acc[e], &dst[e], first, last);
}

// colsum_put sums column j of the rows×cols matrix x in float64, in row
// order (colSum in model/layer.go), and puts it into acc / dst; with mode 1 it
// writes dst[j] = (float)(alpha·sum) instead (paramGrad's bias).
__global__ void colsum_put(int rows, int cols, const float *x, double *acc, float *dst, int first, int last,
                           int mode, float alpha) {
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	if (j >= cols) return;
	double s = 0.0;
	for (int r = 0; r < rows; r++) s += (double)x[(size_t)r * cols + j];
	if (mode == 1)
		dst[j] = (float)((double)alpha * s);
	else
		put(s, &acc[j], &dst[j], first, last);
}

// ------------------------------------------------------------ elementwise

__global__ void bias_add(int rows, int cols, float *out, const float *bias) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)rows * cols) return;
	out[e] += bias[e % cols];
}

// tanh32 is model/activation.go's tanh32, operation for operation (Eigen's clamped
// 13/6-degree rational approximation), with every product and sum rounded
// separately as Go rounds them (no fused multiply-adds), so that the GPU's
// activations have the CPU's bits for the same inputs: a maximum pooling
// over saturated tanh outputs then picks the same element on both.
__device__ float tanh32(float x) {
	const float clamp = 7.90531110763549805f;
	if (x > clamp)
		x = clamp;
	else if (x < -clamp)
		x = -clamp;
	if (x < 0.0004f && x > -0.0004f) return x;
	const float a1 = 4.89352455891786e-03f, a3 = 6.37261928875436e-04f, a5 = 1.48572235717979e-05f,
	            a7 = 5.12229709037114e-08f, a9 = -8.60467152213735e-11f, a11 = 2.00018790482477e-13f,
	            a13 = -2.76076847742355e-16f, b0 = 4.89352518554385e-03f, b2 = 2.26843463243900e-03f,
	            b4 = 1.18534705686654e-04f, b6 = 1.19825839466702e-06f;
	float x2 = __fmul_rn(x, x);
	float p = __fadd_rn(a11, __fmul_rn(x2, a13));
	p = __fadd_rn(a9, __fmul_rn(x2, p));
	p = __fadd_rn(a7, __fmul_rn(x2, p));
	p = __fadd_rn(a5, __fmul_rn(x2, p));
	p = __fadd_rn(a3, __fmul_rn(x2, p));
	p = __fadd_rn(a1, __fmul_rn(x2, p));
	p = __fmul_rn(x, p);
	float q = __fadd_rn(b4, __fmul_rn(x2, b6));
	q = __fadd_rn(b2, __fmul_rn(x2, q));
	q = __fadd_rn(b0, __fmul_rn(x2, q));
	return __fdiv_rn(p, q);
}

// act_fwd: kind 0 = ReLU (Go's max(x, 0): NaN stays NaN, −0 becomes +0),
// 1 = tanh (tanh32).
__global__ void act_fwd(size_t n, int kind, const float *in, float *out) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	float v = in[e];
	out[e] = kind == 1 ? tanh32(v) : (v > 0.f || isnan(v) ? v : 0.f);
}

// act_bwd: din = dout·f'(x) from the layer's output y, rounded as the CPU
// rounds it (dout·(1 − y·y), three roundings).
__global__ void act_bwd(size_t n, int kind, const float *out, const float *dout, float *din) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	float y = out[e];
	if (kind == 1)
		din[e] = __fmul_rn(dout[e], __fsub_rn(1.f, __fmul_rn(y, y)));
	else
		din[e] = y > 0.f ? dout[e] : 0.f;
}

// permute moves B examples of [c][hw] (dir 0) to [hw][c] or back (dir 1).
__global__ void permute(int B, int c, int hw, int dir, const float *src, float *dst) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t per = (size_t)c * hw;
	if (e >= (size_t)B * per) return;
	size_t i = e / per, r = e % per;
	int ch = r / hw, s = r % hw; // r = ch·hw + s in [c][hw] order
	if (dir == 0)
		dst[i * per + (size_t)s * c + ch] = src[e];
	else
		dst[e] = src[i * per + (size_t)s * c + ch];
}

// softmax_xent: per example i (one thread), in float64 as
// Workspace.softmaxXent: loss[i] = lse − z[y], correct[i], and, if dz is
// not null, dz = scale·(softmax − onehot(y)) rounded to float32.
__global__ void softmax_xent(int B, int k, const float *logits, const int32_t *y, float *dz, float scale,
                             double *loss, int32_t *correct) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= B) return;
	const float *z = logits + (size_t)i * k;
	int arg = 0;
	for (int j = 1; j < k; j++)
		if (z[j] > z[arg]) arg = j;
	double mx = z[arg], se = 0.0;
	for (int j = 0; j < k; j++) se += exp((double)z[j] - mx);
	double lse = mx + log(se);
	int yi = y[i];
	loss[i] = lse - (double)z[yi];
	correct[i] = arg == yi;
	if (dz == 0) return;
	float *d = dz + (size_t)i * k;
	for (int j = 0; j < k; j++) {
		double p = exp((double)z[j] - lse);
		if (j == yi) p -= 1.0;
		d[j] = scale * (float)p;
	}
}

// row_sumsq writes out[i] = Σⱼ x[i, j]² in float64 (each square exact) for
// each of rows rows of cols values (one block of 256 threads per row:
// strided partial sums, then a fixed tree), the sumSq of model/bound.go.
__global__ void row_sumsq(int cols, const float *x, double *out) {
	__shared__ double part[256];
	int i = blockIdx.x, t = threadIdx.x;
	const float *row = x + (size_t)i * cols;
	double s = 0.0;
	for (int j = t; j < cols; j += 256) {
		double v = row[j];
		s += v * v;
	}
	part[t] = s;
	__syncthreads();
	for (int w = 128; w > 0; w >>= 1) {
		if (t < w) part[t] += part[t + w];
		__syncthreads();
	}
	if (t == 0) out[i] = part[0];
}

// clip_rows applies example i's clip factor coef[i] to its row of x (B rows
// of cols values): coef 0 sets the row to zero (so NaN or Inf in it add
// exactly zero: 0·NaN is NaN); otherwise, if scale, x·coef rounded to
// float32 where coef < 1 (ClippedSum's loop).
__global__ void clip_rows(int B, int cols, float *x, const float *coef, int scale) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * cols) return;
	float c = coef[e / cols];
	if (c == 0.f)
		x[e] = 0.f;
	else if (scale && c < 1.f)
		x[e] *= c;
}

// nonfinite sets *flag to 1 if any of the n values is NaN or ±Inf.
__global__ void nonfinite(size_t n, const float *x, int32_t *flag) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	if (!isfinite(x[e])) atomicOr(flag, 1); // a flag, not a sum: the result is the same whatever the order
}

// ----------------------------------------------------------- reductions

// block_sum returns, in thread 0, the sum of v over the block's 256
// threads by a fixed tree (the same order on every run). sh holds 256
// doubles; every thread must call it.
__device__ double block_sum(double v, double *sh) {
	int t = threadIdx.x;
	sh[t] = v;
	__syncthreads();
	for (int w = 128; w > 0; w >>= 1) {
		if (t < w) sh[t] += sh[t + w];
		__syncthreads();
	}
	double r = sh[0];
	__syncthreads();
	return r;
}

// ---------------------------------------------------------- convolution
//
// conv in model/conv.go, on the same layouts: activations channels-last
// (H, W, C) per example, the unfolded input cols [B·T, K] in patch order
// (kh, kw, c), the weights permuted to [O, kh, kw, C] (conv.permute), the
// output [B·T, O]. Geometry: input c×h×w, kernel k, stride s, pad p,
// output ho×wo (T = ho·wo, K = k·k·c).

// conv_im2col writes cols for B examples (conv.im2col): zero outside the
// image.
__global__ void conv_im2col(int B, int c, int h, int w, int k, int s, int p, int ho, int wo, const float *x,
                            float *cols) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t K = (size_t)k * k * c, T = (size_t)ho * wo;
	if (e >= (size_t)B * T * K) return;
	size_t i = e / (T * K), q = e % (T * K);
	int t = q / K, r = q % K;
	int ch = r % c, kw = (r / c) % k, kh = r / (c * k);
	int oh = t / wo, ow = t % wo;
	int hh = oh * s - p + kh, ww = ow * s - p + kw;
	float v = 0.f;
	if (hh >= 0 && hh < h && ww >= 0 && ww < w) v = x[i * h * w * c + ((size_t)hh * w + ww) * c + ch];
	cols[e] = v;
}

// conv_col2im is the adjoint (conv.col2im): each input element sums the
// unfolded entries that copied it, in the CPU's order (output positions
// ascending), so the bits are the CPU's.
__global__ void conv_col2im(int B, int c, int h, int w, int k, int s, int p, int ho, int wo, const float *dcols,
                            float *dx) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t n = (size_t)h * w * c;
	if (e >= (size_t)B * n) return;
	size_t i = e / n, q = e % n;
	int ch = q % c, ww = (q / c) % w, hh = q / ((size_t)c * w);
	size_t K = (size_t)k * k * c, T = (size_t)ho * wo;
	const float *dc = dcols + i * T * K;
	float acc = 0.f;
	for (int kh = k - 1; kh >= 0; kh--) { // oh ascending
		int a = hh + p - kh;
		if (a < 0 || a % s != 0) continue;
		int oh = a / s;
		if (oh >= ho) continue;
		for (int kw = k - 1; kw >= 0; kw--) { // ow ascending
			int b = ww + p - kw;
			if (b < 0 || b % s != 0) continue;
			int ow = b / s;
			if (ow >= wo) continue;
			acc += dc[((size_t)oh * wo + ow) * K + ((size_t)kh * k + kw) * c + ch];
		}
	}
	dx[e] = acc;
}

// conv_permute copies a weight between the public [O, C, kk] order and the
// internal [O, kk, C] one: dir 0 public → internal, 1 back.
__global__ void conv_permute(int o, int c, int kk, int dir, const float *src, float *dst) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)o * c * kk) return;
	size_t in = conv_internal(e, c, kk); // e is the public index
	if (dir == 0)
		dst[in] = src[e];
	else
		dst[e] = src[in];
}

// conv_rows turns the per-row sums of squares a2 (of Aᵢ's rows) and d2 (of
// Dᵢ's rows) into αₜ = √a2·up and βₜ = √d2·up (stored for conv_ghost), and
// per example (one block) the sums of convStats (model/conv.go): rho =
// Σ βₜ√(a2+1), sat = Σ √(a2+1), sb = Σ βₜ, written at out[q·ld + i] for
// q = 0, 1, 2.
__global__ void conv_rows(int T, double up, const double *a2, const double *d2, double *al, double *be,
                          double *out, int ld) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	double rho = 0, sat = 0, sb = 0;
	for (int t = threadIdx.x; t < T; t += 256) {
		size_t r = (size_t)i * T + t;
		double a = a2[r], bt = sqrt(d2[r]) * up, at = sqrt(a + 1.0);
		al[r] = sqrt(a) * up;
		be[r] = bt;
		rho += bt * at;
		sat += at;
		sb += bt;
	}
	rho = block_sum(rho, sh);
	sat = block_sum(sat, sh);
	sb = block_sum(sb, sh);
	if (threadIdx.x == 0) {
		out[i] = rho;
		out[ld + i] = sat;
		out[2 * ld + i] = sb;
	}
}

// conv_biasn writes, per example (one block), Σₒ(Σₜ dₜₒ)² (float64, each
// column summed in t order) to out[i]: the bias part of convStats.n.
__global__ void conv_biasn(int T, int O, const float *dout, double *out) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	const float *D = dout + (size_t)i * T * O;
	double n = 0;
	for (int o = threadIdx.x; o < O; o += 256) {
		double s = 0;
		for (int t = 0; t < T; t++) s += (double)D[(size_t)t * O + o];
		n += s * s;
	}
	n = block_sum(n, sh);
	if (threadIdx.x == 0) out[i] = n;
}

// conv_ghost writes, per example (one block), the ghost sums of convStats
// from its float32 Gram matrices ga = AᵢAᵢᵀ and gd = DᵢDᵢᵀ [T, T] and αₜ,
// βₜ: n̂ = Σ ga·gd, eK = Σ αₜαᵤ|gd|, eO = Σ |ga|βₜβᵤ, eP = Σ |ga·gd|,
// sa = Σ|ga|, sd = Σ|gd|, at out[q·ld + i] for q = 0..5.
__global__ void conv_ghost(int T, const float *ga, const float *gd, const double *al, const double *be,
                           double *out, int ld) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	size_t TT = (size_t)T * T;
	const float *A = ga + i * TT, *D = gd + i * TT;
	const double *alp = al + (size_t)i * T, *bep = be + (size_t)i * T;
	double n = 0, eK = 0, eO = 0, eP = 0, sa = 0, sd = 0;
	for (size_t q = threadIdx.x; q < TT; q += 256) {
		int t = q / T, u = q % T;
		double a = A[q], d = D[q], ad = a * d;
		n += ad;
		eP += fabs(ad);
		eK += alp[t] * alp[u] * fabs(d);
		eO += fabs(a) * bep[t] * bep[u];
		sa += fabs(a);
		sd += fabs(d);
	}
	double v[6] = {n, eK, eO, eP, sa, sd};
	for (int q = 0; q < 6; q++) {
		double r = block_sum(v[q], sh);
		if (threadIdx.x == 0) out[(size_t)q * ld + i] = r;
	}
}

// conv_pergrad writes example i's weight gradient Ĝᵢ = Dᵢᵀ Aᵢ [O, K]
// (internal order) into gi, one thread per element: float32 sums over
// pieces of at most R output positions (fused multiply-adds in t order),
// the pieces added in float64 and rounded to float32 once (conv.product:
// the error γ_R(u32)·ρᵢ of conv.bound).
__global__ void conv_pergrad(int B, int T, int O, int K, int R, const float *dout, const float *cols, float *gi) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t OK = (size_t)O * K;
	if (e >= (size_t)B * OK) return;
	size_t i = e / OK, q = e % OK;
	int o = q / K, kq = q % K;
	const float *D = dout + i * T * O + o, *A = cols + i * T * K + kq;
	double acc = 0;
	for (int t0 = 0; t0 < T; t0 += R) {
		int t1 = min(T, t0 + R);
		float s = 0.f;
		for (int t = t0; t < t1; t++) s = fmaf(D[(size_t)t * O], A[(size_t)t * K], s);
		acc += (double)s;
	}
	gi[e] = (float)acc;
}

// conv_gsum puts, per public element e of the weight [O, C, kk], the sum
// Σᵢ cᵢ·Ĝᵢ[e'] over the examples (in order; e' the internal index) in
// float64 into acc / dst (conv.accGrad when materializing). Examples with
// cᵢ = 0 add nothing (their Ĝᵢ may hold NaN). With mode 1 it writes
// dst[e] = (float)(alpha·Σᵢ Ĝᵢ[e']) instead.
__global__ void conv_gsum(int B, int o, int c, int kk, const float *gi, const float *coef, double *acc, float *dst,
                          int first, int last, int mode, float alpha) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t OK = (size_t)o * c * kk;
	if (e >= OK) return;
	size_t src = conv_internal(e, c, kk);
	double tot = 0;
	for (int i = 0; i < B; i++) {
		float ci = mode == 1 ? 1.f : coef[i];
		if (ci == 0.f) continue;
		tot += (double)ci * (double)gi[(size_t)i * OK + src];
	}
	if (mode == 1)
		dst[e] = (float)((double)alpha * tot);
	else
		put(tot, &acc[e], &dst[e], first, last);
}

// -------------------------------------------------------------- pooling

// pool_fwd (pool.forward): one thread per output element (i, oh, ow, ch),
// window in (kh, kw) order. Max: Go's max (NaN if either is NaN), arg the
// input index (per example) of the first maximum; average: float32 sum,
// then times 1/(k·k).
__global__ void pool_fwd(int B, int c, int h, int w, int k, int s, int ho, int wo, int mx, const float *x, float *y,
                         int32_t *arg) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t nout = (size_t)ho * wo * c;
	if (e >= (size_t)B * nout) return;
	size_t i = e / nout, q = e % nout;
	int ch = q % c, ow = (q / c) % wo, oh = q / ((size_t)c * wo);
	const float *xi = x + i * h * w * c;
	float cur = 0.f;
	int a = 0;
	for (int kh = 0; kh < k; kh++)
		for (int kw = 0; kw < k; kw++) {
			int idx = ((oh * s + kh) * w + ow * s + kw) * c + ch;
			float v = xi[idx];
			if (!mx) {
				cur = __fadd_rn(cur, v);
			} else if (kh == 0 && kw == 0) {
				cur = v;
				a = idx;
			} else {
				if (v > cur) a = idx;
				cur = (isnan(cur) || isnan(v)) ? __int_as_float(0x7fc00000) : (v > cur ? v : cur);
			}
		}
	if (mx) {
		y[e] = cur;
		arg[e] = a;
	} else {
		y[e] = __fmul_rn(cur, 1.f / (float)(k * k));
	}
}

// pool_bwd (pool.backward): one thread per input element, summing the
// output gradients of the windows that contain it in the CPU's order
// (max: outputs ascending, those whose arg is this element; average:
// oh ascending, then kw ascending, each g·(1/(k·k)) rounded first).
__global__ void pool_bwd(int B, int c, int h, int w, int k, int s, int ho, int wo, int mx, const float *dy,
                         const int32_t *arg, float *dx) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t nin = (size_t)h * w * c, nout = (size_t)ho * wo * c;
	if (e >= (size_t)B * nin) return;
	size_t i = e / nin, q = e % nin;
	int ch = q % c, ww = (q / c) % w, hh = q / ((size_t)c * w);
	const float *dyi = dy + i * nout;
	const int32_t *ai = arg + i * nout;
	float inv = 1.f / (float)(k * k);
	float acc = 0.f;
	for (int oh = 0; oh < ho; oh++) {
		int kh = hh - oh * s;
		if (kh < 0 || kh >= k) continue;
		if (mx) {
			for (int ow = 0; ow < wo; ow++) {
				int kw = ww - ow * s;
				if (kw < 0 || kw >= k) continue;
				size_t o = ((size_t)oh * wo + ow) * c + ch;
				if (ai[o] == (int32_t)q) acc = __fadd_rn(acc, dyi[o]);
			}
		} else {
			for (int kw = 0; kw < k; kw++) {
				int b = ww - kw;
				if (b < 0 || b % s != 0) continue;
				int ow = b / s;
				if (ow >= wo) continue;
				acc = __fadd_rn(acc, __fmul_rn(dyi[((size_t)oh * wo + ow) * c + ch], inv));
			}
		}
	}
	dx[e] = acc;
}

// -------------------------------------------------------- embedding bag

// embed_fwd (embedBag.forward): per (i, j), the float32 sum of the
// embeddings of example i's tokens (id < 0 is padding) in token order,
// times inv = 1/n (0 for no tokens); thread j = 0 stores inv.
__global__ void embed_fwd(int B, int L, int D, const float *tok, const float *wt, float *inv, float *y) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * D) return;
	size_t i = e / D;
	int j = e % D;
	const float *ti = tok + i * L;
	float s = 0.f;
	int n = 0;
	for (int q = 0; q < L; q++) {
		float t = ti[q];
		if (t < 0.f) continue;
		n++;
		s = __fadd_rn(s, wt[(size_t)t * D + j]);
	}
	float r = n > 0 ? 1.f / (float)n : 0.f;
	if (j == 0) inv[i] = r;
	y[e] = n > 0 ? __fmul_rn(s, r) : 0.f;
}

// embed_acc (embedBag.accGrad): per element (v, j) of the weight [V, D],
// adds inv[i]·d[i, j] in float64 once per occurrence of token v, over the
// occurrences ex[off[v] .. off[v+1]) (example indices, in example then
// position order: the CPU's order), into acc (cleared first if first),
// rounded into dst if last. With mode 1 it writes dst = (float)(alpha·sum).
__global__ void embed_acc(int V, int D, const int32_t *off, const int32_t *ex, const float *inv, const float *dout,
                          double *acc, float *dst, int first, int last, int mode, float alpha) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)V * D) return;
	int v = e / D, j = e % D;
	double s = (first || mode == 1) ? 0.0 : acc[e];
	for (int q = off[v]; q < off[v + 1]; q++) {
		int i = ex[q];
		s += (double)inv[i] * (double)dout[(size_t)i * D + j];
	}
	if (mode == 1)
		dst[e] = (float)((double)alpha * s);
	else if (last)
		dst[e] = (float)s;
	else
		acc[e] = s;
}

// ----------------------------------------------------------- layer norm

// ln_fwd (layerNorm.forward): one block per example; mean and variance in
// float64 (fixed trees), r = 1/√(var+eps), x̂ = (float)((x−μ)·r),
// y = g·x̂ + b (two float32 roundings, as on the CPU).
__global__ void ln_fwd(int f, double eps, const float *x, const float *wt, float *xhat, float *rstd, float *y) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	const float *xi = x + (size_t)i * f;
	double mu = 0;
	for (int j = threadIdx.x; j < f; j += 256) mu += (double)xi[j];
	mu = block_sum(mu, sh) / (double)f;
	double vr = 0;
	for (int j = threadIdx.x; j < f; j += 256) {
		double d = (double)xi[j] - mu;
		vr += d * d;
	}
	vr = block_sum(vr, sh) / (double)f;
	double r = 1.0 / sqrt(vr + eps);
	if (threadIdx.x == 0) rstd[i] = (float)r;
	for (int j = threadIdx.x; j < f; j += 256) {
		float xh = (float)(((double)xi[j] - mu) * r);
		xhat[(size_t)i * f + j] = xh;
		y[(size_t)i * f + j] = __fadd_rn(__fmul_rn(wt[j], xh), wt[f + j]);
	}
}

// ln_bwd (layerNorm.backward): one block per example.
__global__ void ln_bwd(int f, const float *wt, const float *xhat, const float *rstd, const float *dy, float *dx) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	const float *xh = xhat + (size_t)i * f, *d = dy + (size_t)i * f;
	double m1 = 0, m2 = 0;
	for (int j = threadIdx.x; j < f; j += 256) {
		double v = (double)d[j] * (double)wt[j];
		m1 += v;
		m2 += v * (double)xh[j];
	}
	m1 = block_sum(m1, sh) / (double)f;
	m2 = block_sum(m2, sh) / (double)f;
	double r = (double)rstd[i];
	for (int j = threadIdx.x; j < f; j += 256) {
		double v = (double)d[j] * (double)wt[j];
		dx[(size_t)i * f + j] = (float)(r * (v - m1 - (double)xh[j] * m2));
	}
}

// ln_stats writes, per example (one block), n = Σ (dⱼx̂ⱼ)² + dⱼ² and
// x2 = Σ x̂ⱼ² (float64) to out[i] and out[ld + i] (layerNorm.bound).
__global__ void ln_stats(int f, const float *xhat, const float *dy, double *out, int ld) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	const float *xh = xhat + (size_t)i * f, *d = dy + (size_t)i * f;
	double n = 0, x2 = 0;
	for (int j = threadIdx.x; j < f; j += 256) {
		double dv = d[j], x = xh[j], gx = dv * x;
		n += gx * gx + dv * dv;
		x2 += x * x;
	}
	n = block_sum(n, sh);
	x2 = block_sum(x2, sh);
	if (threadIdx.x == 0) {
		out[i] = n;
		out[ld + i] = x2;
	}
}

// ln_acc (layerNorm.accGrad): per feature j, the gain and bias gradient
// sums Σᵢ dᵢⱼx̂ᵢⱼ and Σᵢ dᵢⱼ in float64 in example order, put into
// acc / dst at j and f + j; with mode 1, dst = (float)(alpha·sum).
__global__ void ln_acc(int B, int f, const float *xhat, const float *dy, double *acc, float *dst, int first,
                       int last, int mode, float alpha) {
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	if (j >= f) return;
	double gs = 0, bs = 0;
	for (int i = 0; i < B; i++) {
		double d = dy[(size_t)i * f + j];
		gs += d * (double)xhat[(size_t)i * f + j];
		bs += d;
	}
	if (mode == 1) {
		dst[j] = (float)((double)alpha * gs);
		dst[f + j] = (float)((double)alpha * bs);
	} else {
		put(gs, &acc[j], &dst[j], first, last);
		put(bs, &acc[f + j], &dst[f + j], first, last);
	}
}

// ------------------------------------------------------ sequence layers
//
// The transformer's layers (model/seq_*.go) on the CPU's layouts: a
// sequence activation is [B, T, D] row-major, an attention input holds, at
// each position, the query, key and value (D each, head h at h·dh). A
// linear layer at T positions is the convolution kernels above (a 1×1
// convolution, as on the CPU: seqLinear), a layer norm at T positions is
// ln_fwd, ln_bwd and ln_acc over B·T rows; what is new is below. The
// float32 operations of the forward and backward passes are rounded one by
// one (__fadd_rn, __fmul_rn: no fused multiply-adds) in the CPU's order, so
// that for the same inputs they give the CPU's bits, except where a
// float64 exp is taken (attention's softmax, the next-token loss): CUDA's
// exp and Go's math.Exp may differ in the last bit.

// put_sums writes example i's nv per-example sums v (each already
// reduced: the same in every thread) at out[q·ld + i], from thread 0.
__device__ __forceinline__ void put_sums(const double *v, int nv, double *out, int ld, int i) {
	if (threadIdx.x == 0)
		for (int q = 0; q < nv; q++) out[(size_t)q * ld + i] = v[q];
}

// seq_embed_fwd (seqEmbedState.forward): y[i, t, j] = pos[t, j] + tok[id, j]
// (pos alone for padding, id < 0); wt holds tok [V, D] then pos [T, D].
__global__ void seq_embed_fwd(int B, int T, int D, int V, const float *ids, const float *wt, float *y) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * T * D) return;
	size_t r = e / D; // row i·T + t
	int j = e % D, t = r % T;
	float v = wt[(size_t)V * D + (size_t)t * D + j];
	float id = ids[r];
	if (id >= 0.f) v = __fadd_rn(v, wt[(size_t)id * D + j]);
	y[e] = v;
}

// seq_embed_stats writes, per example (one block), the sums of
// seqEmbedState.bound: n = Σₜ‖dₜ‖² (position rows) + Σ_v ‖Σ_{t: idₜ=v} dₜ‖²
// (token rows, each summed in float64 in position order) at out[i], and
// rho = 2·Σₜ‖dₜ‖ at out[ld + i]. Every loop bound and branch before a
// block_sum depends on the example's ids only, so all threads reach it.
__global__ void seq_embed_stats(int T, int D, const float *ids, const float *dy, double *out, int ld) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	const float *id = ids + (size_t)i * T, *d = dy + (size_t)i * T * D;
	double np = 0, rho = 0;
	for (int t = 0; t < T; t++) {
		double s = 0;
		for (int j = threadIdx.x; j < D; j += 256) {
			double v = d[(size_t)t * D + j];
			s += v * v;
		}
		s = block_sum(s, sh);
		np += s;
		rho += 2.0 * sqrt(s);
	}
	double nt = 0;
	for (int t = 0; t < T; t++) {
		float v = id[t];
		if (v < 0.f) continue;
		bool first = true;
		for (int u = 0; u < t && first; u++) first = id[u] != v;
		if (!first) continue; // the token's row was summed at its first position
		for (int j = threadIdx.x; j < D; j += 256) {
			double s = 0;
			for (int u = t; u < T; u++)
				if (id[u] == v) s += (double)d[(size_t)u * D + j];
			nt += s * s;
		}
	}
	double sums[2] = {np + block_sum(nt, sh), rho};
	put_sums(sums, 2, out, ld, i);
}

// seq_ln_stats writes, per example (one block), the sums of
// seqLNState.bound over its T rows [T, f]: n = Σⱼ (Σₜ dₜⱼx̂ₜⱼ)² + (Σₜ dₜⱼ)²,
// rho2 = Σⱼ (Σₜ|dₜⱼx̂ₜⱼ|)² + (Σₜ|dₜⱼ|)² (each inner sum in float64 in t
// order) and xn = Σₜ √(Σⱼ x̂ₜⱼ² + f), at out[i], out[ld + i], out[2·ld + i].
__global__ void seq_ln_stats(int T, int f, const float *xhat, const float *dy, double *out, int ld) {
	__shared__ double sh[256];
	int i = blockIdx.x;
	const float *xh = xhat + (size_t)i * T * f, *d = dy + (size_t)i * T * f;
	double n = 0, rho = 0;
	for (int j = threadIdx.x; j < f; j += 256) {
		double gs = 0, bs = 0, ga = 0, ba = 0;
		for (int t = 0; t < T; t++) {
			double dv = d[(size_t)t * f + j], gx = dv * (double)xh[(size_t)t * f + j];
			gs += gx;
			bs += dv;
			ga += fabs(gx);
			ba += fabs(dv);
		}
		n += gs * gs + bs * bs;
		rho += ga * ga + ba * ba;
	}
	double xn = 0;
	for (int t = threadIdx.x; t < T; t += 256) {
		double x2 = 0;
		for (int j = 0; j < f; j++) {
			double x = xh[(size_t)t * f + j];
			x2 += x * x;
		}
		xn += sqrt(x2 + (double)f);
	}
	double sums[3] = {block_sum(n, sh), block_sum(rho, sh), block_sum(xn, sh)};
	put_sums(sums, 3, out, ld, i);
}

// gomax32 is Go's max for float32 as the CPU's attention uses it: NaN if
// either is NaN.
__device__ __forceinline__ float gomax32(float a, float b) {
	if (isnan(a) || isnan(b)) return __int_as_float(0x7fc00000);
	return a > b ? a : b;
}

// dot_rn is model's dot32: Σⱼ a[j]·b[j] in float32, j ascending, each
// product and sum rounded.
__device__ __forceinline__ float dot_rn(const float *a, const float *b, int n) {
	float s = 0.f;
	for (int j = 0; j < n; j++) s = __fadd_rn(s, __fmul_rn(a[j], b[j]));
	return s;
}

// attn_pos is the place of attention thread e = (i·H + h)·T + t: example
// i, position t, row = i·T + t of the output [B·T, D], the head's offset
// ho = h·dh and width dh = D/H in a position's D values, the input's row
// length D3 = 3·D.
struct attn_pos {
	size_t i, row;
	int t, ho, dh, D3;
};

__device__ __forceinline__ attn_pos attn_at(size_t e, int T, int H, int D) {
	attn_pos a;
	a.t = e % T;
	a.i = e / ((size_t)T * H);
	a.row = a.i * T + a.t;
	a.dh = D / H;
	a.ho = (int)((e / T) % H) * a.dh;
	a.D3 = 3 * D;
	return a;
}

// attn_fwd (attnState.forward): one thread per (example i, head h,
// position t), e = (i·H + h)·T + t. Scores sᵤ = dot(qₜ, kᵤ)·scale for
// u ≤ t, their max, eᵤ = exp(sᵤ − max) in float64 summed in u order,
// Pₜᵤ = (float)eᵤ·(float)(1/Σe) into probs [B, H, T, T] (row t, u ≤ t; the
// rest of the row is not written), and outₜ = Σᵤ Pₜᵤ vᵤ (u ascending) into
// y [B, T, D].
__global__ void attn_fwd(int B, int T, int D, int H, float scale, const float *x, float *probs, float *y) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * H * T) return;
	attn_pos a = attn_at(e, T, H, D);
	const float *xi = x + a.i * T * a.D3;
	const float *q = xi + (size_t)a.t * a.D3 + a.ho;
	float *P = probs + e * T;
	float mx = -INFINITY;
	for (int u = 0; u <= a.t; u++) {
		float s = __fmul_rn(dot_rn(q, xi + (size_t)u * a.D3 + D + a.ho, a.dh), scale);
		P[u] = s;
		mx = gomax32(mx, s);
	}
	double se = 0;
	for (int u = 0; u <= a.t; u++) {
		double ev = exp((double)__fsub_rn(P[u], mx));
		P[u] = (float)ev;
		se += ev;
	}
	float inv = (float)(1.0 / se);
	for (int u = 0; u <= a.t; u++) P[u] = __fmul_rn(P[u], inv);
	float *o = y + a.row * D + a.ho;
	for (int j = 0; j < a.dh; j++) {
		float s = 0.f;
		for (int u = 0; u <= a.t; u++) s = __fadd_rn(s, __fmul_rn(P[u], xi[(size_t)u * a.D3 + 2 * D + a.ho + j]));
		o[j] = s;
	}
}

// attn_bwd_q (attnState.backward, the query part): one thread per
// (i, h, t) as attn_fwd. With gₜ the output gradient: ∂Pₜᵤ = dot(gₜ, vᵤ),
// m = Σᵤ Pₜᵤ∂Pₜᵤ (float32, u order), ∂Sₜᵤ = Pₜᵤ·(∂Pₜᵤ − m)·scale into ds
// [B, H, T, T] (row t, u ≤ t), and ∂qₜ = Σᵤ ∂Sₜᵤ kᵤ into dx [B, T, 3D].
__global__ void attn_bwd_q(int B, int T, int D, int H, float scale, const float *x, const float *probs,
                           const float *g, float *ds, float *dx) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * H * T) return;
	attn_pos a = attn_at(e, T, H, D);
	const float *xi = x + a.i * T * a.D3;
	const float *gt = g + a.row * D + a.ho;
	const float *P = probs + e * T;
	float *S = ds + e * T;
	float m = 0.f;
	for (int u = 0; u <= a.t; u++) {
		float dp = dot_rn(gt, xi + (size_t)u * a.D3 + 2 * D + a.ho, a.dh);
		S[u] = dp;
		m = __fadd_rn(m, __fmul_rn(P[u], dp));
	}
	for (int u = 0; u <= a.t; u++) S[u] = __fmul_rn(__fmul_rn(P[u], __fsub_rn(S[u], m)), scale);
	float *dq = dx + a.row * a.D3 + a.ho;
	for (int j = 0; j < a.dh; j++) {
		float s = 0.f;
		for (int u = 0; u <= a.t; u++) s = __fadd_rn(s, __fmul_rn(S[u], xi[(size_t)u * a.D3 + D + a.ho + j]));
		dq[j] = s;
	}
}

// attn_bwd_kv (attnState.backward, the key and value parts): one thread per
// (i, h, u), e = (i·H + h)·T + u: ∂vᵤ = Σ_{t≥u} Pₜᵤ gₜ and
// ∂kᵤ = Σ_{t≥u} ∂Sₜᵤ qₜ, t ascending (the CPU adds them in that order), from
// attn_fwd's probs and attn_bwd_q's ds, which must have run.
__global__ void attn_bwd_kv(int B, int T, int D, int H, const float *x, const float *probs, const float *ds,
                            const float *g, float *dx) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * H * T) return;
	attn_pos a = attn_at(e, T, H, D);
	int u = a.t;
	const float *xi = x + a.i * T * a.D3, *gi = g + a.i * T * D;
	const float *P = probs + (e - u) * T, *S = ds + (e - u) * T; // row 0 of (i, h)
	float *dxi = dx + a.row * a.D3;
	for (int j = 0; j < a.dh; j++) {
		float sv = 0.f, sk = 0.f;
		for (int t = u; t < T; t++) {
			size_t tu = (size_t)t * T + u;
			sv = __fadd_rn(sv, __fmul_rn(P[tu], gi[(size_t)t * D + a.ho + j]));
			sk = __fadd_rn(sk, __fmul_rn(S[tu], xi[(size_t)t * a.D3 + a.ho + j]));
		}
		dxi[D + a.ho + j] = sk;
		dxi[2 * D + a.ho + j] = sv;
	}
}

// mean_pool_fwd (meanPool.forward): y[i, j] = (Σₜ x[i, t, j], float32,
// t ascending)·(1/T).
__global__ void mean_pool_fwd(int B, int T, int D, const float *x, float *y) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * D) return;
	size_t i = e / D;
	int j = e % D;
	float s = 0.f;
	for (int t = 0; t < T; t++) s = __fadd_rn(s, x[(i * T + t) * D + j]);
	y[e] = __fmul_rn(s, 1.f / (float)T);
}

// mean_pool_bwd (meanPool.backward): dx[i, t, j] = dy[i, j]·(1/T).
__global__ void mean_pool_bwd(int B, int T, int D, const float *dy, float *dx) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (size_t)B * T * D) return;
	size_t i = e / ((size_t)T * D);
	int j = e % D;
	dx[e] = __fmul_rn(dy[i * D + j], 1.f / (float)T);
}

// add2: y = a + b elementwise (a residual block's output, and its input
// gradient: the skip plus the nested layers' one).
__global__ void add2(size_t n, const float *a, const float *b, float *y) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	y[e] = __fadd_rn(a[e], b[e]);
}

// token_xent (Workspace.nextTokenXent): one thread per position r = i·T + t
// of the logits [B, T, V] against the targets tgt [B, T] (−1: padding). At
// a target: loss[r] = lse − z[target] and correct[r] in float64 as
// softmax_xent, and, if dz is not null, dz = (scale/nᵢ)·(softmax −
// onehot(target)) rounded to float32, nᵢ the example's number of targets;
// at padding: loss 0, correct 0, a zero dz row.
__global__ void token_xent(int B, int T, int V, const float *logits, const int32_t *tgt, float *dz, float scale,
                           double *loss, int32_t *correct) {
	size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (r >= (size_t)B * T) return;
	size_t i = r / T;
	const float *z = logits + r * V;
	float *d = dz == 0 ? 0 : dz + r * V;
	int tg = tgt[r];
	if (tg < 0) {
		loss[r] = 0;
		correct[r] = 0;
		if (d != 0)
			for (int j = 0; j < V; j++) d[j] = 0.f;
		return;
	}
	int n = 0;
	for (int u = 0; u < T; u++) n += tgt[i * T + u] >= 0;
	int arg = 0;
	for (int j = 1; j < V; j++)
		if (z[j] > z[arg]) arg = j;
	double mx = z[arg], se = 0.0;
	for (int j = 0; j < V; j++) se += exp((double)z[j] - mx);
	double lse = mx + log(se);
	loss[r] = lse - (double)z[tg];
	correct[r] = arg == tg;
	if (d == 0) return;
	float s = __fdiv_rn(scale, (float)n);
	for (int j = 0; j < V; j++) {
		double p = exp((double)z[j] - lse);
		if (j == tg) p -= 1.0;
		d[j] = __fmul_rn(s, (float)p);
	}
}
}

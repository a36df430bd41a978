// CUDA kernels of the GPU engine (model/cuda.go, build tag "cuda").
//
// Generated into cuda_kernels.ptx by `go generate ./model` (see gen.go),
// which runs
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
// bound.go hold with or without them). No kernel uses atomics in a
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
// [z·kblock, min(k, (z+1)·kblock)) into C + z·sc (the per-block products
// of accgrad, see accgrad in cuda.go); kblock = k and one z for a plain
// product.
#define KBATCH()                                                                                                       \
	int kstart = blockIdx.z * kblock;                                                                                \
	k = min(kblock, k - kstart);                                                                                     \
	a += TA ? (size_t)kstart * lda : (size_t)kstart;                                                                 \
	b += TB ? (size_t)kstart : (size_t)kstart * ldb;                                                                 \
	c += (size_t)blockIdx.z * sc;

template <bool TA, bool TB>
__device__ void sgemm_body(int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                           float beta, float *c, int ldc, int kblock, size_t sc) {
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

// sgemm128: the same product on 128×128 tiles of C (BK = 8, 256 threads,
// each an 8×8 tile: rows ty·4 + i and 64 + ty·4 + i, columns likewise, so
// that the 16-byte shared-memory reads are free of bank conflicts), with
// the next k-slab loaded into registers while the current one is
// multiplied, and two shared-memory buffers. Every element is the same
// sequential fused multiply-add chain along k as in sgemm_body (zero
// padding adds exact zeros), so the two kernels give the same bits; the
// host picks this one when it has enough tiles to fill the GPU.
template <bool TA, bool TB>
__device__ void sgemm128_body(int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                              float beta, float *c, int ldc, int kblock, size_t sc) {
	KBATCH()
	__shared__ __align__(16) float As[2][8][128];
	__shared__ __align__(16) float Bs[2][8][128];
	int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
	int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
	float ra[4], rb[4];
	// Which elements this thread loads: A (row, p), B (p, col), 4 each.
	int arow[4], ap[4], bcol[4], bp[4];
#pragma unroll
	for (int q = 0; q < 4; q++) {
		if (TA) {
			ap[q] = tid / 32;
			arow[q] = (tid % 32) * 4 + q;
		} else {
			arow[q] = tid / 2;
			ap[q] = (tid % 2) * 4 + q;
		}
		if (TB) {
			bcol[q] = tid / 2;
			bp[q] = (tid % 2) * 4 + q;
		} else {
			bp[q] = tid / 32;
			bcol[q] = (tid % 32) * 4 + q;
		}
	}
#define LOAD128(k0)                                                                                                    \
	_Pragma("unroll") for (int q = 0; q < 4; q++) {                                                                  \
		int gi = m0 + arow[q], gp = (k0) + ap[q];                                                                \
		ra[q] = (gi < m && gp < k) ? (TA ? a[(size_t)gp * lda + gi] : a[(size_t)gi * lda + gp]) : 0.f;           \
		int gj = n0 + bcol[q], gq = (k0) + bp[q];                                                                \
		rb[q] = (gj < n && gq < k) ? (TB ? b[(size_t)gj * ldb + gq] : b[(size_t)gq * ldb + gj]) : 0.f;           \
	}
#define STORE128(buf)                                                                                                  \
	_Pragma("unroll") for (int q = 0; q < 4; q++) {                                                                  \
		As[buf][ap[q]][arow[q]] = ra[q];                                                                         \
		Bs[buf][bp[q]][bcol[q]] = rb[q];                                                                         \
	}
	float acc[8][8];
#pragma unroll
	for (int i = 0; i < 8; i++)
#pragma unroll
		for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
	LOAD128(0)
	STORE128(0)
	__syncthreads();
	int cur = 0;
	for (int k0 = 0; k0 < k; k0 += 8) {
		bool next = k0 + 8 < k;
		if (next) {
			LOAD128(k0 + 8)
		}
#pragma unroll
		for (int p = 0; p < 8; p++) {
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
			STORE128(cur ^ 1)
			__syncthreads();
			cur ^= 1;
		}
	}
#undef LOAD128
#undef STORE128
#pragma unroll
	for (int i = 0; i < 8; i++) {
		int gi = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
		if (gi >= m) continue;
#pragma unroll
		for (int j = 0; j < 8; j++) {
			int gj = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
			if (gj >= n) continue;
			float *cp = &c[(size_t)gi * ldc + gj];
			float v = alpha * acc[i][j];
			if (beta != 0.f) v += beta * *cp;
			*cp = v;
		}
	}
}

#define SGEMM_ARGS                                                                                                     \
	int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c,        \
	    int ldc, int kblock, size_t sc
#define SGEMM_PASS m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, kblock, sc

extern "C" {
__global__ void sgemm_nn(SGEMM_ARGS) { sgemm_body<false, false>(SGEMM_PASS); }
__global__ void sgemm_nt(SGEMM_ARGS) { sgemm_body<false, true>(SGEMM_PASS); }
__global__ void sgemm_tn(SGEMM_ARGS) { sgemm_body<true, false>(SGEMM_PASS); }
__global__ void sgemm_tt(SGEMM_ARGS) { sgemm_body<true, true>(SGEMM_PASS); }
__global__ void __launch_bounds__(256, 2) sgemm128_nn(SGEMM_ARGS) { sgemm128_body<false, false>(SGEMM_PASS); }
__global__ void __launch_bounds__(256, 2) sgemm128_nt(SGEMM_ARGS) { sgemm128_body<false, true>(SGEMM_PASS); }
__global__ void __launch_bounds__(256, 2) sgemm128_tn(SGEMM_ARGS) { sgemm128_body<true, false>(SGEMM_PASS); }

// put applies put32's rule (layers.go) to one element: tot is this call's
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

// blocks_put sums, per element e of n, the nb float32 block products
// blk[z·n + e] (z in order) in float64 and puts the total into acc / dst:
// the accumulation of linear.accGrad (float32 products over blocks of
// blockRows rows, each added into a float64 total; linear.bound's λ).
__global__ void blocks_put(size_t n, int nb, const float *blk, double *acc, float *dst, int first, int last) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	double tot = 0.0;
	for (int z = 0; z < nb; z++) tot += (double)blk[(size_t)z * n + e];
	put(tot, &acc[e], &dst[e], first, last);
}

// colsum_put sums column j of the rows×cols matrix x in float64, in row
// order (colSum in layers.go), and puts it into acc / dst; with mode 1 it
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

// act_fwd: kind 0 = ReLU (max(x, 0)), 1 = tanh.
__global__ void act_fwd(size_t n, int kind, const float *in, float *out) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	float v = in[e];
	out[e] = kind == 1 ? tanhf(v) : fmaxf(v, 0.f);
}

// act_bwd: din = dout·f'(x) from the layer's output y.
__global__ void act_bwd(size_t n, int kind, const float *out, const float *dout, float *din) {
	size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= n) return;
	float y = out[e];
	if (kind == 1)
		din[e] = dout[e] * (1.f - y * y);
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
// strided partial sums, then a fixed tree), the sumSq of bound.go.
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
}

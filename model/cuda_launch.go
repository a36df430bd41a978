//go:build cuda

package model

import (
	"fmt"
	"math"
	"unsafe"

	"gorgonia.org/cu"
)

// size from the slot's start, little-endian).
type karg uint64

func i32(v int) karg {
	if v < math.MinInt32 || v > math.MaxInt32 {
		panic(fmt.Sprintf("model: cuda kernel argument %d overflows int32", v))
	}
	return karg(uint32(int32(v)))
}
func f32(v float32) karg      { return karg(math.Float32bits(v)) }
func f64(v float64) karg      { return karg(math.Float64bits(v)) }
func sz(v int) karg           { return karg(uint64(v)) }
func ptr(p cu.DevicePtr) karg { return karg(p) }
func flag(b bool) karg {
	if b {
		return 1
	}
	return 0
}

// launch3 runs kernel fn on a grid of gx×gy×gz blocks of bx×by threads.
// Errors of the kernel itself surface at the next synchronizing call.
func launch3(fn cu.Function, gx, gy, gz, bx, by int, args ...karg) error {
	if gx == 0 || gy == 0 || gz == 0 {
		return nil
	}
	p := make([]unsafe.Pointer, len(args))
	for i := range args {
		p[i] = unsafe.Pointer(&args[i])
	}
	return fn.Launch(gx, gy, gz, bx, by, 1, 0, cu.Stream{}, p)
}

// launch runs kernel fn on a grid of gx×gy blocks of bx×by threads.
func launch(fn cu.Function, gx, gy, bx, by int, args ...karg) error {
	return launch3(fn, gx, gy, 1, bx, by, args...)
}

// launch1 runs an elementwise kernel over n items, 256 threads a block.
func launch1(fn cu.Function, n int, args ...karg) error {
	return launch(fn, (n+255)/256, 1, 256, 1, args...)
}

const (
	gemmTile = 64 // BM = BN of sgemm_body in kernels/cuda_kernels.cu
	// bigTiles is the number of 128×128 tiles from which sgemm uses the
	// 128×128 kernel (an H100 has 132 multiprocessors, each running two
	// such blocks).
	bigTiles = 128
	// maxBlockGroup is the number of blockRows-row block products accGrad
	// forms at once (its scratch buffer holds that many of the largest
	// linear layer's weight matrix).
	maxBlockGroup = 8
)

// sgemm launches C = alpha·op(A)·op(B) + beta·C on device buffers.
func (d *cudaDevice) sgemm(transA, transB bool, m, n, k int, alpha float32, a cu.DevicePtr, lda int, b cu.DevicePtr, ldb int, beta float32, c cu.DevicePtr, ldc int) error {
	return d.sgemmBlocks(transA, transB, m, n, k, max(k, 1), 0, alpha, a, lda, b, ldb, beta, c, ldc)
}

// gemmKernel names one of the GEMM kernels of kernels/cuda_kernels.cu.
// They all compute every element as the same fused multiply-add chain
// along k, so the choice, a function of the shape alone, does not change
// the bits.
type gemmKernel int

const (
	gemm64   gemmKernel = iota // sgemm_*: 64×64 tiles, any shape
	gemm128                    // sgemm128_*: 128×128 tiles, k-slabs of 8
	gemm128v                   // sgemm128v_*: the same, float4 loads and stores (aligned shapes)
	gemm128w                   // sgemm128w_*: float4, k-slabs of 16 (aligned shapes)
)

var gemmNames = [...]string{"64", "128", "128v", "128w"}

func (g gemmKernel) String() string { return gemmNames[g] }

// cudaGemmWide is the 128×128 kernel sgemm uses for a large product whose
// shape allows it (gemm128v and gemm128w need aligned operands; gemm128
// takes the rest); the benchmarks set it to compare the kernels on the
// same shapes. gemm128v: on an H100 (BenchmarkCUDASgemm, the wide MLP's
// products at B = 1024) it runs at 35–44 TFLOP/s where gemm128 ran at
// 29–41 and cuBLAS at 32–48 (docs/BENCHMARKS.md); gemm128w is no faster.
var cudaGemmWide = gemm128v

// gemmArgs is one launch of a GEMM kernel: nz products, the k-range
// [z·kblock, min(k, (z+1)·kblock)) of product z into C + z·sc (kblock 0:
// nz products of the whole k, operands strided by sa, sb and sc).
type gemmArgs struct {
	v, nz, m, n, k, kblock int
	sc, sa, sb             int
	alpha, beta            float32
	a, b, c                cu.DevicePtr
	lda, ldb, ldc          int
}

// variant is v's index: 0 nn, 1 nt, 2 tn, 3 tt.
func variant(transA, transB bool) int {
	v := 0
	if transA {
		v += 2
	}
	if transB {
		v++
	}
	return v
}

// aligned reports whether the float4 kernels may run g: every dimension
// that is read or written four at a time, every leading dimension, offset
// and stride a multiple of 4 floats, every pointer on 16 bytes.
func (g *gemmArgs) aligned() bool {
	kb := 0
	if g.nz > 1 {
		kb = g.kblock // only block z > 0 starts at z·kblock
	}
	for _, x := range []int{g.m, g.n, g.k, kb, g.sc, g.sa, g.sb, g.lda, g.ldb, g.ldc} {
		if x%4 != 0 {
			return false
		}
	}
	return g.a%16 == 0 && g.b%16 == 0 && g.c%16 == 0
}

// pick is the kernel sgemm runs for g: a 128×128 one once there are enough
// tiles to fill the GPU (and not tt), cudaGemmWide where g is aligned.
func (g *gemmArgs) pick() gemmKernel {
	if ((g.m+127)/128)*((g.n+127)/128)*g.nz < bigTiles || g.v == 3 {
		return gemm64
	}
	if cudaGemmWide != gemm128 && g.aligned() {
		return cudaGemmWide
	}
	return gemm128
}

// sgemmBlocks launches ⌈k/kblock⌉ products at once: product z multiplies
// the k-range [z·kblock, min(k, (z+1)·kblock)) into C + z·sc.
func (d *cudaDevice) sgemmBlocks(transA, transB bool, m, n, k, kblock, sc int, alpha float32, a cu.DevicePtr, lda int, b cu.DevicePtr, ldb int, beta float32, c cu.DevicePtr, ldc int) error {
	nz := 1
	if k > 0 {
		nz = (k + kblock - 1) / kblock
	}
	g := gemmArgs{v: variant(transA, transB), nz: nz, m: m, n: n, k: k, kblock: kblock, sc: sc,
		alpha: alpha, beta: beta, a: a, b: b, c: c, lda: lda, ldb: ldb, ldc: ldc}
	return d.gemm(g.pick(), &g)
}

// sgemmBatched launches nz independent products C + z·sc = op(A + z·sa) ·
// op(B + z·sb) (alpha 1, beta 0): a convolution's per-example Gram
// matrices.
func (d *cudaDevice) sgemmBatched(transA, transB bool, nz, m, n, k int, a cu.DevicePtr, lda, sa int, b cu.DevicePtr, ldb, sb int, c cu.DevicePtr, ldc, sc int) error {
	g := gemmArgs{v: variant(transA, transB), nz: nz, m: m, n: n, k: k, sc: sc, sa: sa, sb: sb,
		alpha: 1, a: a, b: b, c: c, lda: lda, ldb: ldb, ldc: ldc}
	return d.gemm(g.pick(), &g)
}

// gemm launches kernel kind on g.
func (d *cudaDevice) gemm(kind gemmKernel, g *gemmArgs) error {
	args := []karg{i32(g.m), i32(g.n), i32(g.k), f32(g.alpha), ptr(g.a), i32(g.lda), ptr(g.b), i32(g.ldb),
		f32(g.beta), ptr(g.c), i32(g.ldc), i32(g.kblock), sz(g.sc), sz(g.sa), sz(g.sb)}
	gx, gy := (g.n+127)/128, (g.m+127)/128
	switch kind {
	case gemm128:
		return launch3(d.k.sgemm128[g.v], gx, gy, g.nz, 256, 1, args...)
	case gemm128v:
		return launch3(d.k.sgemm128v[g.v], gx, gy, g.nz, 256, 1, args...)
	case gemm128w:
		return launch3(d.k.sgemm128w[g.v], gx, gy, g.nz, 256, 1, args...)
	}
	return launch3(d.k.sgemm[g.v], (g.n+gemmTile-1)/gemmTile, (g.m+gemmTile-1)/gemmTile, g.nz, 16, 16, args...)
}

// alloc allocates n bytes (at least 1) of device memory.
func alloc(n int) (cu.DevicePtr, error) {
	p, err := cu.MemAlloc(int64(max(n, 1)))
	if err != nil {
		return 0, fmt.Errorf("model: cuda: allocating %d bytes: %w", n, err)
	}
	return p, nil
}

func htod[T float32 | float64 | int32](dst cu.DevicePtr, src []T) error {
	if len(src) == 0 {
		return nil
	}
	return cu.MemcpyHtoD(dst, unsafe.Pointer(&src[0]), int64(len(src))*int64(unsafe.Sizeof(src[0])))
}

func dtoh[T float32 | float64 | int32](dst []T, src cu.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), src, int64(len(dst))*int64(unsafe.Sizeof(dst[0])))
}

// off4 and off8 offset a device pointer by n float32 / float64 elements.
func off4(p cu.DevicePtr, n int) cu.DevicePtr { return p + cu.DevicePtr(4*n) }
func off8(p cu.DevicePtr, n int) cu.DevicePtr { return p + cu.DevicePtr(8*n) }

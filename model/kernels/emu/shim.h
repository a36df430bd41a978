// CPU emulation of the CUDA C the kernels use, for emulate.cpp (see
// model/cuda_emu_test.go): a launch runs its blocks one after another,
// each thread of a block as a host thread, __syncthreads as a barrier,
// __shared__ arrays as function statics (one block at a time uses them).
// The rounded intrinsics are plain float operations, which the harness is
// compiled not to fuse (-ffp-contract=off).
#include <math.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
using std::isfinite;
using std::isnan;
using std::max;
using std::min;

struct dim3 {
	unsigned x = 0, y = 0, z = 0;
};
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<> *emu_barrier;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(a, b)

inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __int_as_float(int v) {
	float f;
	memcpy(&f, &v, 4);
	return f;
}
inline int atomicOr(int32_t *p, int v) { // one thread at a time in the harness's use
	int o = *p;
	*p |= v;
	return o;
}
struct float4 {
	float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

// emu_launch runs f on gx blocks of bx threads (1-D grids only).
template <class F> void emu_launch(int gx, int bx, F f) {
	blockDim.x = bx;
	blockDim.y = blockDim.z = 1;
	gridDim.x = gx;
	for (int b = 0; b < gx; b++) {
		std::barrier<> bar(bx);
		emu_barrier = &bar;
		std::vector<std::thread> th;
		for (int t = 0; t < bx; t++)
			th.emplace_back([&, t, b] {
				threadIdx.x = t;
				blockIdx.x = b;
				f();
			});
		for (auto &x : th) x.join();
	}
}

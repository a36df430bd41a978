// A CPU stand-in for the CUDA driver (libcuda.so.1) that runs the engine's
// kernels, ../cuda_kernels.cu compiled as C++ through shim.h, so that the
// cuda-tagged Go test binary runs on a machine without a GPU
// (cuda-on-cpu.sh builds and runs it). It implements the driver calls the
// engine makes (device, context, module, memory, copies, launches, events);
// cuda-on-cpu.sh adds a stub returning CUDA_ERROR_NOT_SUPPORTED for every
// other symbol the binary links. It is slow (a launch runs its blocks one
// after another, each block's threads as fibers of one host thread) and it
// is not a GPU: it checks the engine's arithmetic, indexing and glue, not
// a GPU's memory model, concurrency or speed.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "shim.h"
// __syncthreads as a fiber switch (fiber_run), not shim.h's barrier of
// host threads: much faster for the many small blocks of a test.
#define __syncthreads emu_fiber_sync
void emu_fiber_sync();
#include "../cuda_kernels.cu"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
using Kern = std::function<void(void **)>;
template <class... A, size_t... I> void callk(void (*f)(A...), void **p, std::index_sequence<I...>) {
	f(*(std::remove_cv_t<A> *)p[I]...);
}
template <class... A> Kern wrap(void (*f)(A...)) {
	return [f](void **p) { callk(f, p, std::index_sequence_for<A...>{}); };
}
struct Fn {
	std::string name;
	Kern k;
	bool sync;
};
static std::map<std::string, Fn> *table;
#define K(n, s) (*table)[#n] = Fn{#n, wrap(n), s};
static void init_table() {
	if (table) return;
	table = new std::map<std::string, Fn>;
	K(sgemm_nn, 1) K(sgemm_nt, 1) K(sgemm_tn, 1) K(sgemm_tt, 1)
	K(sgemm128_nn, 1) K(sgemm128_nt, 1) K(sgemm128_tn, 1)
	K(sgemm128v_nn, 1) K(sgemm128v_nt, 1) K(sgemm128v_tn, 1)
	K(sgemm128w_nn, 1) K(sgemm128w_nt, 1) K(sgemm128w_tn, 1)
	K(blocks_put, 0) K(colsum_put, 0) K(bias_add, 0) K(act_fwd, 0) K(act_bwd, 0) K(permute, 0)
	K(softmax_xent, 0) K(row_sumsq, 1) K(clip_rows, 0) K(nonfinite, 0)
	K(conv_im2col, 0) K(conv_col2im, 0) K(conv_permute, 0) K(conv_rows, 1) K(conv_biasn, 1) K(conv_ghost, 1)
	K(conv_pergrad, 0) K(conv_gsum, 0) K(pool_fwd, 0) K(pool_bwd, 0) K(embed_fwd, 0) K(embed_acc, 0)
	K(ln_fwd, 1) K(ln_bwd, 1) K(ln_stats, 1) K(ln_acc, 0)
	K(seq_embed_fwd, 0) K(seq_embed_stats, 1) K(seq_ln_stats, 1) K(attn_fwd, 0) K(attn_bwd_q, 0)
	K(attn_bwd_kv, 0) K(mean_pool_fwd, 0) K(mean_pool_bwd, 0) K(add2, 0) K(token_xent, 0)
}

// Device memory: each allocation ends 0..15 bytes before a PROT_NONE page
// (its start 16-aligned), and is filled with 0xFF (NaN) bytes, as a real
// allocation holds garbage.
struct Alloc {
	void *base;
	size_t len;
};
static std::map<CUdeviceptr, Alloc> allocs;
static std::mutex mu;

// fiber_run runs job(0..n-1) as n fibers of this thread: each runs until
// its __syncthreads (a switch back here) or its end; a pass resumes every
// fiber not yet ended once, so no fiber passes a __syncthreads before all
// have reached it.
static ucontext_t fmain;
static std::vector<ucontext_t> fctx;
static std::vector<std::vector<char>> fstack;
static std::vector<char> fdone;
static unsigned fcur;
static std::function<void(unsigned)> *fjob;
static std::vector<dim3> fidx;
void emu_fiber_sync() {
	unsigned me = fcur;
	fidx[me] = threadIdx;
	swapcontext(&fctx[me], &fmain);
	threadIdx = fidx[me]; // thread_local: the fibers share this thread's
}
static void fiber_entry(unsigned i) {
	(*fjob)(i);
	fdone[i] = 1;
}
static void fiber_run(unsigned n, std::function<void(unsigned)> job) {
	fjob = &job;
	fctx.resize(n);
	fstack.resize(n);
	fdone.assign(n, 0);
	fidx.resize(n);
	for (unsigned i = 0; i < n; i++) {
		fstack[i].resize(256 << 10);
		getcontext(&fctx[i]);
		fctx[i].uc_stack.ss_sp = fstack[i].data();
		fctx[i].uc_stack.ss_size = fstack[i].size();
		fctx[i].uc_link = &fmain;
		makecontext(&fctx[i], (void (*)())fiber_entry, 1, i);
	}
	for (bool left = true; left;) {
		left = false;
		for (unsigned i = 0; i < n; i++) {
			if (fdone[i]) continue;
			fcur = i;
			swapcontext(&fmain, &fctx[i]);
			left |= !fdone[i];
		}
	}
}

extern "C" {
CUresult cuInit(unsigned) { init_table(); return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 11080; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int o) { *d = o; return o == 0 ? 0 : 101; }
CUresult cuDeviceGetName(char *s, int n, int) { snprintf(s, n, "CPU emulation of the kernels"); return 0; }
CUresult cuDeviceTotalMem_v2(size_t *b, int) { *b = (size_t)16 << 30; return 0; }
CUresult cuDeviceGetAttribute(int *v, int a, int) {
	*v = a == 75 ? 9 : a == 76 ? 0 : 1;
	return 0;
}
static int ctxv;
CUresult cuCtxCreate_v2(void **c, unsigned, int) { *c = &ctxv; return 0; }
CUresult cuCtxDestroy_v2(void *) { return 0; }
CUresult cuCtxSetCurrent(void *) { return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = &ctxv; return 0; }
CUresult cuCtxPopCurrent_v2(void **c) { if (c) *c = &ctxv; return 0; }
CUresult cuCtxPushCurrent_v2(void *) { return 0; }
CUresult cuCtxSynchronize() { return 0; }
static int modv;
CUresult cuModuleLoadData(void **m, const void *) { init_table(); *m = &modv; return 0; }
CUresult cuModuleUnload(void *) { return 0; }
CUresult cuModuleGetFunction(void **f, void *, const char *name) {
	auto it = table->find(name);
	if (it == table->end()) { fprintf(stderr, "fakecuda: no kernel %s\n", name); return 500; }
	*f = &it->second;
	return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	size_t pg = sysconf(_SC_PAGESIZE), body = (n + pg - 1) / pg * pg + pg, len = body + pg;
	char *base = (char *)mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED) return 2;
	mprotect(base + body, pg, PROT_NONE);
	char *start = (char *)(((uintptr_t)(base + body - n)) & ~(uintptr_t)15);
	memset(start, 0xFF, base + body - start);
	std::lock_guard<std::mutex> l(mu);
	*p = (CUdeviceptr)start;
	allocs[*p] = {base, len};
	return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
	std::lock_guard<std::mutex> l(mu);
	auto it = allocs.find(p);
	if (it == allocs.end()) { fprintf(stderr, "fakecuda: free of %llx\n", p); abort(); }
	munmap(it->second.base, it->second.len);
	allocs.erase(it);
	return 0;
}
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = *t = (size_t)16 << 30; return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)s, n); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove((void *)d, (void *)s, n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *) { return cuMemcpyHtoD_v2(d, s, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *) { return cuMemcpyDtoH_v2(d, s, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *) { return cuMemcpyDtoD_v2(d, s, n); }
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) {
	for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v;
	return 0;
}
CUresult cuMemAllocHost_v2(void **p, size_t n) { *p = malloc(n); return 0; }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
static int strv, evv;
CUresult cuStreamCreate(void **s, unsigned) { *s = &strv; return 0; }
CUresult cuStreamDestroy_v2(void *) { return 0; }
CUresult cuStreamSynchronize(void *) { return 0; }
CUresult cuEventCreate(void **e, unsigned) { *e = &evv; return 0; }
CUresult cuEventDestroy_v2(void *) { return 0; }
CUresult cuEventRecord(void *, void *) { return 0; }
CUresult cuEventSynchronize(void *) { return 0; }
CUresult cuEventQuery(void *) { return 0; }

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned, void *, void **p, void **) {
	Fn *fn = (Fn *)f;
	gridDim = {gx, gy, gz};
	blockDim = {bx, by, bz};
	unsigned nt = bx * by * bz;
	for (unsigned z = 0; z < gz; z++)
		for (unsigned y = 0; y < gy; y++)
			for (unsigned x = 0; x < gx; x++) {
				dim3 b{x, y, z};
				auto one = [&](unsigned t) {
					threadIdx = {t % bx, (t / bx) % by, t / (bx * by)};
					blockIdx = b;
					fn->k(p);
				};
				if (!fn->sync) {
					emu_barrier = nullptr; // a __syncthreads here crashes: the kernel is misfiled
					for (unsigned t = 0; t < nt; t++) one(t);
					continue;
				}
				fiber_run(nt, one);
			}
	return 0;
}
}


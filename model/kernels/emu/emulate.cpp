// The sequence layers' kernels of ../cuda_kernels.cu, run on the CPU
// (shim.h) on the inputs a CPU workspace used and compared with what it
// computed from them: see model/cuda_emu_test.go, which writes the dump
// (argv[1]), runs this, and turns the per-example sums it writes (argv[2])
// into bounds with the CPU's formulas. Exit status 0 when every
// comparison here holds.
#include "shim.h"

#include "../cuda_kernels.cu"

#include <cstdio>
#include <map>
#include <string>

// The dump: named arrays, each a uint32 name length, the name, a type byte
// ('f' float32, 'd' float64, 'i' int32), a uint64 count and the values,
// little-endian (cudaEmuDump in model/cuda_emu_test.go).
struct Arr {
	char t;
	std::vector<char> b;
};
std::map<std::string, Arr> A;

bool load(const char *path) {
	FILE *f = fopen(path, "rb");
	if (f == nullptr) return false;
	uint32_t l;
	while (fread(&l, 4, 1, f) == 1) {
		std::string name(l, ' ');
		Arr a;
		uint64_t n;
		if (fread(&name[0], 1, l, f) != l || fread(&a.t, 1, 1, f) != 1 || fread(&n, 8, 1, f) != 1) break;
		size_t sz = a.t == 'd' ? 8 : 4;
		a.b.resize(n * sz);
		if (n > 0 && fread(a.b.data(), sz, n, f) != n) break;
		A[name] = a;
	}
	fclose(f);
	return true;
}

template <class T> T *P(const char *n) { return (T *)A.at(n).b.data(); }

int fails = 0;

// cmp compares n float32 results (those mask selects) with the CPU's:
// equal bits, or within tol relative.
void cmp(const char *what, const float *got, const float *want, size_t n, double tol,
         const std::vector<bool> *mask = nullptr) {
	size_t exact = 0, cnt = 0;
	double worst = 0;
	for (size_t k = 0; k < n; k++) {
		if (mask && !(*mask)[k]) continue;
		cnt++;
		if (memcmp(&got[k], &want[k], 4) == 0) {
			exact++;
			continue;
		}
		double d = fabs((double)got[k] - want[k]) / fmax(fabs((double)want[k]), 1e-30);
		worst = fmax(worst, d);
		if (!(d <= tol)) {
			if (fails < 20) printf("  %s[%zu]: got %.9g want %.9g\n", what, k, got[k], want[k]);
			fails++;
		}
	}
	printf("%-12s %zu values, %zu bit-equal, worst rel %.3g\n", what, cnt, exact, worst);
}

FILE *saved;

// save writes float64 results to the SUMS file in the dump's format, for
// the Go test to turn into bounds with the CPU's formulas.
void save(const char *name, const std::vector<double> &v) {
	uint32_t l = strlen(name);
	uint64_t n = v.size();
	fwrite(&l, 4, 1, saved);
	fwrite(name, 1, l, saved);
	fputc('d', saved);
	fwrite(&n, 8, 1, saved);
	fwrite(v.data(), 8, n, saved);
}

// cmpd compares n float64 results with the CPU's to tol relative.
void cmpd(const char *what, const double *got, const double *want, size_t n, double tol) {
	double worst = 0;
	for (size_t k = 0; k < n; k++) {
		double d = fabs(got[k] - want[k]) / fmax(fabs(want[k]), 1e-300);
		worst = fmax(worst, d);
		if (!(d <= tol)) {
			printf("  %s[%zu]: got %.17g want %.17g\n", what, k, got[k], want[k]);
			fails++;
		}
	}
	printf("%-12s %zu values, worst rel %.3g\n", what, n, worst);
}

int main(int argc, char **argv) {
	if (argc != 3 || !load(argv[1]) || (saved = fopen(argv[2], "wb")) == nullptr) {
		fprintf(stderr, "usage: emulate DUMP SUMS\n");
		return 2;
	}
	int *dm = P<int>("dims");
	int B = dm[0], T = dm[1], D = dm[2], V = dm[3], H = dm[4];
	float scale = (float)(1 / sqrt((double)(D / H)));
	float *theta = P<float>("theta");
	auto el = [](size_t n, auto f) { emu_launch((n + 255) / 256, 256, f); };
	// embedding forward
	std::vector<float> y(B * T * D);
	el(B * T * D, [&] { seq_embed_fwd(B, T, D, V, P<float>("ids"), theta, y.data()); });
	cmp("emb_out", y.data(), P<float>("emb_out"), y.size(), 0);
	// attention forward
	std::vector<float> probs(B * H * T * T), out(B * T * D);
	el(B * H * T, [&] { attn_fwd(B, T, D, H, scale, P<float>("qkv"), probs.data(), out.data()); });
	std::vector<bool> mask(probs.size());
	for (size_t k = 0; k < mask.size(); k++) mask[k] = (k % T) <= ((k / T) % T);
	cmp("probs", probs.data(), P<float>("probs"), probs.size(), 1e-6, &mask);
	cmp("attn_out", out.data(), P<float>("attn_out"), out.size(), 1e-5);
	// attention backward, from the CPU's probs
	std::vector<float> ds(B * H * T * T), din(B * T * 3 * D, NAN);
	el(B * H * T, [&] { attn_bwd_q(B, T, D, H, scale, P<float>("qkv"), P<float>("probs"), P<float>("attn_dout"), ds.data(), din.data()); });
	el(B * H * T, [&] { attn_bwd_kv(B, T, D, H, P<float>("qkv"), P<float>("probs"), ds.data(), P<float>("attn_dout"), din.data()); });
	cmp("attn_din", din.data(), P<float>("attn_din"), din.size(), 0);
	// residual
	std::vector<float> ro(B * T * D), rd(B * T * D);
	el(ro.size(), [&] { add2(ro.size(), P<float>("emb_out"), P<float>("res_f"), ro.data()); });
	cmp("res_out", ro.data(), P<float>("res_out"), ro.size(), 0);
	el(rd.size(), [&] { add2(rd.size(), P<float>("res_dout"), P<float>("res_g0"), rd.data()); });
	cmp("res_din", rd.data(), P<float>("res_din"), rd.size(), 0);
	// stats
	std::vector<double> st(3 * B, NAN);
	emu_launch(B, 256, [&] { seq_ln_stats(T, D, P<float>("ln_xhat"), P<float>("ln_dout"), st.data(), B); });
	save("ln_stats", st);
	std::vector<double> es(2 * B, NAN);
	emu_launch(B, 256, [&] { seq_embed_stats(T, D, P<float>("ids"), P<float>("emb_grad"), es.data(), B); });
	save("emb_stats", es);
	// next-token loss (MeanGrad's scale 1/B)
	std::vector<float> dz(B * T * V, NAN);
	std::vector<double> loss(B * T, NAN);
	std::vector<int32_t> corr(B * T);
	el(B * T, [&] { token_xent(B, T, V, P<float>("logits"), P<int32_t>("targets"), dz.data(), 1.f / (float)B, loss.data(), corr.data()); });
	cmp("dlogits", dz.data(), P<float>("dlogits"), dz.size(), 1e-6);
	cmpd("rowloss", loss.data(), P<double>("rowloss"), loss.size(), 1e-14);
	// meanpool
	std::vector<float> mo(B * D), mdi(B * T * D);
	el(B * D, [&] { mean_pool_fwd(B, T, D, P<float>("mp_in"), mo.data()); });
	cmp("mp_out", mo.data(), P<float>("mp_out"), mo.size(), 0);
	el(B * T * D, [&] { mean_pool_bwd(B, T, D, P<float>("mp_dout"), mdi.data()); });
	cmp("mp_din", mdi.data(), P<float>("mp_din"), mdi.size(), 0);
	// the embedding's clipped sum (fresh and final) and non-private gradient
	size_t np = (size_t)V * D + (size_t)T * D;
	std::vector<double> acc(np, NAN);
	std::vector<float> dst(np, NAN);
	el(V * D, [&] { embed_acc(V, D, P<int32_t>("tok_off"), P<int32_t>("tok_ex"), P<float>("tok_inv"), P<float>("emb_grad"), acc.data(), dst.data(), 1, 1, 0, 0); });
	el(T * D, [&] { colsum_put(B, T * D, P<float>("emb_grad"), acc.data() + V * D, dst.data() + V * D, 1, 1, 0, 0); });
	cmp("emb_acc", dst.data(), P<float>("emb_acc"), np, 0);
	std::vector<float> pg(np, NAN);
	el(V * D, [&] { embed_acc(V, D, P<int32_t>("tok_off"), P<int32_t>("tok_ex"), P<float>("tok_inv"), P<float>("emb_grad"), acc.data(), pg.data(), 1, 1, 1, 1.f); });
	el(T * D, [&] { colsum_put(B, T * D, P<float>("emb_grad"), acc.data(), pg.data() + V * D, 0, 0, 1, 1.f); });
	cmp("emb_pg", pg.data(), P<float>("emb_pg"), np, 1e-6);
	// the nested layer norm over B·T rows
	std::vector<float> xh(B * T * D), rstd(B * T), lo(B * T * D);
	emu_launch(B * T, 256, [&] { ln_fwd(D, 1e-5, P<float>("emb_out"), theta + P<int32_t>("ln1_off")[0], xh.data(), rstd.data(), lo.data()); });
	cmp("ln_xhat", xh.data(), P<float>("ln_xhat"), xh.size(), 1e-6);
	cmp("ln1_out", lo.data(), P<float>("ln1_out"), lo.size(), 1e-5);
	fclose(saved);
	printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
	return fails != 0;
}

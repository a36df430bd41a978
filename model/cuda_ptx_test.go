package model

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/model/kernels"
)

// TestCUDAPTXMatchesSource: the committed PTX (kernels/cuda_kernels.ptx,
// which package kernels embeds for cuda-tagged builds) was generated from
// the committed CUDA source: its first line records the source's SHA-256
// (kernels/gen_ptx.sh). Runs everywhere; it needs no GPU and no nvcc.
func TestCUDAPTXMatchesSource(t *testing.T) {
	src, err := os.ReadFile("kernels/cuda_kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	ptx, err := os.ReadFile("kernels/cuda_kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	if kernels.PTX() != string(ptx) {
		t.Fatal("kernels.PTX() is not kernels/cuda_kernels.ptx")
	}
	sum := sha256.Sum256(src)
	first, _, _ := strings.Cut(string(ptx), "\n")
	want := "(sha256 " + hex.EncodeToString(sum[:]) + ")"
	if !strings.Contains(first, want) {
		t.Fatalf("cuda_kernels.ptx was not generated from this cuda_kernels.cu (first line %q, want it to contain %q): run go generate ./model/kernels (needs nvcc)", first, want)
	}
	for _, k := range []string{"sgemm_nn", "sgemm_nt", "sgemm_tn", "sgemm_tt", "sgemm128_nn", "sgemm128_nt", "sgemm128_tn", "blocks_put", "colsum_put", "bias_add",
		"act_fwd", "act_bwd", "permute", "softmax_xent", "row_sumsq", "clip_rows", "nonfinite",
		"conv_im2col", "conv_col2im", "conv_permute", "conv_rows", "conv_biasn", "conv_ghost", "conv_pergrad", "conv_gsum",
		"pool_fwd", "pool_bwd", "embed_fwd", "embed_acc", "ln_fwd", "ln_bwd", "ln_stats", "ln_acc",
		"seq_embed_fwd", "seq_embed_stats", "seq_ln_stats", "attn_fwd", "attn_bwd_q", "attn_bwd_kv",
		"mean_pool_fwd", "mean_pool_bwd", "add2", "token_xent"} {
		if !strings.Contains(string(ptx), ".entry "+k+"(") {
			t.Errorf("cuda_kernels.ptx has no kernel %s", k)
		}
	}
}

package model

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"unsafe"
)

// TestCUDAKernelsEmulated runs the sequence layers' CUDA kernels without a
// GPU: kernels/emu/emulate.cpp compiles kernels/cuda_kernels.cu as C++ with
// a shim (kernels/emu/shim.h: each thread of a block a host thread,
// __syncthreads a barrier) and runs them on the inputs a CPU workspace used
// in one step of a small language model (padding, a repeated token) and
// of a classifier, checking their outputs against what the workspace
// computed: the embedding's output and clipped sum, attention's output
// gradient from the CPU's probabilities, the residual sums and the mean
// pool with the CPU's bits; attention's probabilities and output, the
// next-token loss's gradient and the layer norm at T positions within
// 1e-5 (the host's exp and the GPU's may differ from Go's in the last
// bit, the layer norm's mean is a tree); the per-example sums of the
// embedding's and the layer norm's bounds within 1e-13. It checks the
// kernels' arithmetic and indexing, not the engine's glue or a GPU's
// memory model (the cuda-tagged tests do, on a GPU). Needs g++ (C++20);
// skipped without it unless DPCLUSTER_CI is set.
func TestCUDAKernelsEmulated(t *testing.T) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		if os.Getenv("DPCLUSTER_CI") != "" {
			t.Fatal("DPCLUSTER_CI is set but g++ is missing (scripts/lib/setup.sh installs it)")
		}
		t.Skip("g++ not found")
	}
	dir := t.TempDir()
	dump, sums := filepath.Join(dir, "dump.bin"), filepath.Join(dir, "sums.bin")
	data, checkBounds := cudaEmuDump(t)
	if err := os.WriteFile(dump, data, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "emulate")
	out, err := exec.Command(gxx, "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-w", "-o", bin, "kernels/emu/emulate.cpp").CombinedOutput()
	if err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, dump, sums).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("emulated kernels disagree with the CPU engine: %v", err)
	}
	raw, err := os.ReadFile(sums)
	if err != nil {
		t.Fatal(err)
	}
	checkBounds(t, readEmuSums(t, raw))
}

// readEmuSums reads emulate.cpp's SUMS file: named float64 arrays in the
// dump's format.
func readEmuSums(t *testing.T, raw []byte) map[string][]float64 {
	out := map[string][]float64{}
	r := bytes.NewReader(raw)
	for r.Len() > 0 {
		var l uint32
		var n uint64
		binary.Read(r, binary.LittleEndian, &l)
		name := make([]byte, l)
		r.Read(name)
		typ, _ := r.ReadByte()
		binary.Read(r, binary.LittleEndian, &n)
		v := make([]float64, n)
		if err := binary.Read(r, binary.LittleEndian, v); err != nil || typ != 'd' {
			t.Fatalf("sums file: %q: type %c, %v", name, typ, err)
		}
		out[string(name)] = v
	}
	return out
}

// cudaEmuDump runs one MeanGrad step of a small language model and of a
// classifier on the CPU and returns what emulate.cpp reads: each kernel's
// inputs and the CPU's results, as named arrays (a uint32 name length,
// the name, a type byte 'f', 'd' or 'i', a uint64 count, the values;
// little-endian); and a check that the per-example sums the emulated
// seq_ln_stats and seq_embed_stats wrote, put through the CPU's bound
// formulas (boundSeqExample, boundExample) as the GPU engine puts them,
// give the CPU's bounds to 1e-12 relative.
func cudaEmuDump(t *testing.T) ([]byte, func(*testing.T, map[string][]float64)) {
	var buf bytes.Buffer
	put := func(name string, typ byte, p unsafe.Pointer, n, size int) {
		binary.Write(&buf, binary.LittleEndian, uint32(len(name)))
		buf.WriteString(name)
		buf.WriteByte(typ)
		binary.Write(&buf, binary.LittleEndian, uint64(n))
		if n > 0 {
			buf.Write(unsafe.Slice((*byte)(p), n*size))
		}
	}
	f32 := func(name string, v []float32) { put(name, 'f', unsafe.Pointer(unsafe.SliceData(v)), len(v), 4) }
	f64 := func(name string, v []float64) { put(name, 'd', unsafe.Pointer(unsafe.SliceData(v)), len(v), 8) }
	i32 := func(name string, v []int32) { put(name, 'i', unsafe.Pointer(unsafe.SliceData(v)), len(v), 4) }

	const B, T, D, V, H = 3, 6, 8, 11, 2
	m, err := NewWithBackend(TransformerLM(V, T, D, 1, H), Gonum{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	theta := randomTheta(t, m, 5)
	x, y := randomBatch(m, B, rng)
	for j := range T + 1 {
		x[T+1+j] = 3 // example 1: one token everywhere
	}
	x[2*(T+1)+2], x[2*(T+1)+5] = -1, -1 // example 2: padding
	ws, _ := m.NewWorkspace(B)
	if _, err := ws.MeanGrad(make([]float32, m.numParams), theta, x, y); err != nil {
		t.Fatal(err)
	}
	i32("dims", []int32{B, T, D, V, H})
	f32("theta", theta)
	ids, ed := ws.act[0][:B*T], ws.grad[1][:B*T*D]
	f32("ids", ids)
	f32("emb_out", ws.act[1][:B*T*D])
	f32("emb_grad", ed)
	rs := ws.states[1].(*resState) // layernorm, linear 3D, attention, linear D
	f32("qkv", rs.act[2][:B*T*3*D])
	f32("attn_out", rs.act[3][:B*T*D])
	f32("probs", rs.states[2].(*attnState).probs[:B*H*T*T])
	f32("attn_dout", rs.grad[3][:B*T*D])
	f32("attn_din", rs.grad[2][:B*T*3*D])
	f32("res_f", rs.act[4][:B*T*D])
	f32("res_out", ws.act[2][:B*T*D])
	f32("res_dout", ws.grad[2][:B*T*D])
	f32("res_g0", rs.grad[0][:B*T*D])
	f32("res_din", ws.grad[1][:B*T*D])
	f32("ln_xhat", rs.states[0].(*seqLNState).rows.xhat[:B*T*D])
	f32("ln_dout", rs.grad[1][:B*T*D])
	i32("ln1_off", []int32{int32(m.layerOff[1] + rs.r.off[0])})
	f32("ln1_out", rs.act[1][:B*T*D])
	// The embedding's clipped sum through the engine's token index.
	ix := newTokenIndex(1, V, B*T)
	ix.build(ids, B*T)
	i32("tok_off", ix.off)
	i32("tok_ex", ix.ex[:ix.off[V]])
	f32("tok_inv", ix.inv[:B*T])
	se := m.layers[0].(*seqEmbed)
	acc := make([]float64, m.layerSize[0])
	addSeqEmbedGrad(se, acc, B, ids, ed, 1)
	sum := make([]float32, len(acc))
	for j, v := range acc {
		sum[j] = float32(v)
	}
	f32("emb_acc", sum)
	pg := make([]float32, m.layerSize[0])
	addSeqEmbedGrad(se, pg, B, ids, ed, 1)
	f32("emb_pg", pg)
	L := len(m.layers)
	f32("logits", ws.act[L][:B*T*V])
	i32("targets", ws.targets[:B*T])
	f32("dlogits", ws.grad[L][:B*T*V])
	rl := make([]float64, B*T)
	for r := range rl {
		if tg := ws.targets[r]; tg >= 0 {
			rl[r], _ = xentRow(nil, ws.act[L][r*V:(r+1)*V], int(tg), 0)
		}
	}
	f64("rowloss", rl)

	mc, err := NewWithBackend(TransformerClassifier(9, T, D, 1, H, 3), Gonum{})
	if err != nil {
		t.Fatal(err)
	}
	xc, yc := randomBatch(mc, B, rng)
	wc, _ := mc.NewWorkspace(B)
	if _, err := wc.MeanGrad(make([]float32, mc.numParams), randomTheta(t, mc, 7), xc, yc); err != nil {
		t.Fatal(err)
	}
	lp := len(mc.layers) - 2 // the meanpool
	f32("mp_in", wc.act[lp][:B*T*D])
	f32("mp_out", wc.act[lp+1][:B*D])
	f32("mp_dout", wc.grad[lp+1][:B*D])
	f32("mp_din", wc.grad[lp][:B*T*D])
	check := func(t *testing.T, sums map[string][]float64) {
		ln, lnS, emS := rs.r.layers[0].(*seqLayerNorm), sums["ln_stats"], sums["emb_stats"]
		if len(lnS) != 3*B || len(emS) != 2*B {
			t.Fatalf("sums: %d and %d values, want %d and %d", len(lnS), len(emS), 3*B, 2*B)
		}
		want, got := newClipBounds(B), newClipBounds(B)
		rs.states[0].bound(ws.pass(B), rs.act[0], rs.act[1], rs.grad[1], want)
		ws.states[0].bound(ws.pass(B), ws.act[0], ws.act[1], ws.grad[1], want)
		for i := range B {
			ln.boundSeqExample(got, i, lnS[i], lnS[B+i], lnS[2*B+i])
			se.boundExample(got, i, emS[i], emS[B+i])
		}
		for i := range B {
			for _, q := range [][2]float64{{got.sq[i], want.sq[i]}, {got.share[i], want.share[i]}, {got.floor[i], want.floor[i]}} {
				if !(math.Abs(q[0]-q[1]) <= 1e-12*math.Abs(q[1])) {
					t.Fatalf("example %d: bound (sq, share, floor) %v, %v, %v from the emulated sums, %v, %v, %v on the CPU",
						i, got.sq[i], got.share[i], got.floor[i], want.sq[i], want.share[i], want.floor[i])
				}
			}
		}
	}
	return buf.Bytes(), check
}

package model

// tokenIndex is, for one batch of token sequences (an embedding bag's
// input), what the GPU engine's embedding kernels and bounds need from the
// host: each example's token count nᵢ, c2ᵢ = Σ_v n_{iv}² (exact) and the
// float32 1/nᵢ for the bound, and the index embed_acc sums by: for each
// vocabulary row v, the examples holding token v, once per occurrence, in
// example then position order (the CPU's order of accGrad's additions), so
// that the device's sum needs no atomics and has the CPU's bits.
type tokenIndex struct {
	L    int       // tokens per example
	ntok []int     // [maxB]
	c2   []float64 // [maxB]
	inv  []float32 // [maxB]
	off  []int32   // [V+1]: token v's examples are ex[off[v]:off[v+1]]
	pos  []int32   // scratch [V]
	ex   []int32   // [maxB·L]
}

func newTokenIndex(L, V, maxB int) tokenIndex {
	return tokenIndex{L: L, ntok: make([]int, maxB), c2: make([]float64, maxB), inv: make([]float32, maxB),
		off: make([]int32, V+1), pos: make([]int32, V), ex: make([]int32, maxB*L)}
}

// build indexes the B examples of x (token ids, integers in [-1, V); -1 is
// padding). c2 comes from the index itself: token v's list holds example
// i's occurrences contiguously, so each run is one n_{iv}, and a sum of
// integer squares is exact in float64 in any order (tokenCounts's value).
func (h *tokenIndex) build(x []float32, B int) {
	L := h.L
	clear(h.off)
	for i := 0; i < B; i++ {
		n := 0
		for _, t := range x[i*L : (i+1)*L] {
			if t >= 0 {
				h.off[int(t)+1]++
				n++
			}
		}
		h.ntok[i], h.c2[i], h.inv[i] = n, 0, 0
		if n > 0 {
			h.inv[i] = 1 / float32(n) // as embedBag.forward and embed_fwd
		}
	}
	for v := 1; v < len(h.off); v++ {
		h.off[v] += h.off[v-1]
	}
	copy(h.pos, h.off[:len(h.pos)])
	for i := 0; i < B; i++ {
		for _, t := range x[i*L : (i+1)*L] {
			if t >= 0 {
				h.ex[h.pos[int(t)]] = int32(i)
				h.pos[int(t)]++
			}
		}
	}
	for v := range h.pos {
		list := h.ex[h.off[v]:h.off[v+1]]
		for j := 0; j < len(list); {
			r := j + 1
			for r < len(list) && list[r] == list[j] {
				r++
			}
			n := float64(r - j)
			h.c2[list[j]] += n * n
			j = r
		}
	}
}

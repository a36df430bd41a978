package model

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestTokenIndex: the GPU engine's token index gives every example's count,
// Σ_v n_{iv}² and 1/nᵢ as the CPU's bound computes them (tokenCounts,
// embedBag.forward), and lists every occurrence of every token exactly
// once, in example order: on random batches with padding, repeated
// tokens, an all-padding example, and reuse of the same index.
func TestTokenIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	const L, V, maxB = 9, 6, 12
	h := newTokenIndex(L, V, maxB)
	for round := 0; round < 50; round++ {
		B := 1 + rng.IntN(maxB)
		x := make([]float32, B*L)
		for j := range x {
			x[j] = float32(rng.IntN(V+2) - 2) // -2, -1: padding (build accepts any id < 0 as such)
			if x[j] < -1 {
				x[j] = -1
			}
		}
		if B > 1 {
			for j := range L {
				x[j] = -1 // example 0: all padding
			}
		}
		h.build(x, B)
		var tok []int32
		for i := 0; i < B; i++ {
			var n int
			var c2 float64
			tok, n, c2 = tokenCounts(tok, x[i*L:(i+1)*L])
			if h.ntok[i] != n || h.c2[i] != c2 {
				t.Fatalf("round %d example %d: count %d c2 %v, want %d %v", round, i, h.ntok[i], h.c2[i], n, c2)
			}
			want := float32(0)
			if n > 0 {
				want = 1 / float32(n)
			}
			if h.inv[i] != want {
				t.Fatalf("example %d: inv %v, want %v", i, h.inv[i], want)
			}
		}
		for v := 0; v < V; v++ {
			var want []int32
			for i := 0; i < B; i++ {
				for _, t := range x[i*L : (i+1)*L] {
					if int(t) == v {
						want = append(want, int32(i))
					}
				}
			}
			if got := h.ex[h.off[v]:h.off[v+1]]; !slices.Equal(got, want) {
				t.Fatalf("round %d token %d: examples %v, want %v", round, v, got, want)
			}
		}
	}
}

package aggregation

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLargeVectorsSplitOverCores: for a model-sized vector (several of the
// chunks validate and close split over cores), a NaN or an Inf in any
// chunk is found, NaN winning over Inf as in one pass; the norm bound is
// the serial sum's decision; and the closed sum has, bit for bit, the
// serial loop's value: the nodes added in ascending ID order per element.
func TestLargeVectorsSplitOverCores(t *testing.T) {
	const dim = 3*valueChunk + 123
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func(scale float64) []float32 {
		v := make([]float32, dim)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		return v
	}
	norm := func(v []float32) float64 {
		var s float64
		for _, x := range v {
			s += float64(x) * float64(x)
		}
		return math.Sqrt(s)
	}
	nodes := []string{"c", "a", "b"}
	r, err := NewRound(1, nodes, dim, 1, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		sum  func() []float32
		want error
	}{
		{func() []float32 { v := vec(1e-4); v[dim-1] = float32(math.NaN()); return v }, ErrNaN},
		{func() []float32 {
			v := vec(1e-4)
			v[5] = float32(math.Inf(1))
			v[2*valueChunk+9] = float32(math.NaN())
			return v
		}, ErrNaN},
		{func() []float32 { v := vec(1e-4); v[valueChunk] = float32(math.Inf(-1)); return v }, ErrInf},
		{func() []float32 { v := vec(1); return v }, ErrNormBound}, // norm ≈ √dim ≫ count·C
	}
	for i, b := range bad {
		if err := r.Add(Contribution{NodeID: "a", Step: 1, Count: 2, Sum: b.sum()}); !errors.Is(err, b.want) {
			t.Fatalf("case %d: %v, want %v", i, err, b.want)
		}
	}
	// At the bound: count·C = 3, a vector scaled to norm 3·(1 − 1e-9) passes.
	edge := vec(1)
	f := 3 * (1 - 1e-9) / norm(edge)
	for i := range edge {
		edge[i] = float32(float64(edge[i]) * f)
	}
	if n := norm(edge); n > 3*(1+1e-6) {
		t.Fatalf("edge vector norm %v", n)
	}
	sums := map[string][]float32{"a": edge, "b": vec(1e-5), "c": vec(1e-5)}
	counts := map[string]int64{"a": 3, "b": 1, "c": 1}
	for _, n := range []string{"b", "a", "c"} {
		if err := r.Add(Contribution{NodeID: n, Step: 1, Count: counts[n], Sum: append([]float32(nil), sums[n]...)}); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
	res := r.Close()
	if res.Count != 5 || len(res.Accepted) != 3 {
		t.Fatalf("count %d accepted %v", res.Count, res.Accepted)
	}
	for i := 0; i < dim; i++ {
		var want float64
		for _, n := range []string{"a", "b", "c"} {
			want += float64(sums[n][i])
		}
		if math.Float64bits(res.Sum[i]) != math.Float64bits(want) {
			t.Fatalf("element %d: %v, serial %v", i, res.Sum[i], want)
		}
	}
}

// TestSumBufferReused: a round given a buffer (WithSumBuffer) closes into
// it, whatever it held (here NaN, or the previous round's sum), with the
// bits a round with a fresh sum gets; a buffer of another length is
// ignored.
func TestSumBufferReused(t *testing.T) {
	const dim = 2*valueChunk + 7
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]float64, dim)
	for i := range buf {
		buf[i] = math.NaN()
	}
	for round := uint64(1); round <= 2; round++ {
		v := make([]float32, dim)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 1e-5)
		}
		run := func(opts ...Option) Result {
			r, err := NewRound(round, []string{"a"}, dim, 1, time.Now().Add(time.Hour), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Add(Contribution{NodeID: "a", Step: round, Count: 1, Sum: append([]float32(nil), v...)}); err != nil {
				t.Fatal(err)
			}
			return r.Close()
		}
		fresh, reused := run(), run(WithSumBuffer(buf))
		if &reused.Sum[0] != &buf[0] {
			t.Fatal("the round did not close into the buffer it was given")
		}
		for i := range fresh.Sum {
			if math.Float64bits(fresh.Sum[i]) != math.Float64bits(reused.Sum[i]) {
				t.Fatalf("round %d, element %d: %v in the reused buffer, %v fresh", round, i, reused.Sum[i], fresh.Sum[i])
			}
		}
	}
	if res := func() Result {
		r, _ := NewRound(3, nil, dim, 1, time.Now().Add(time.Hour), WithSumBuffer(make([]float64, 5)))
		return r.Close()
	}(); len(res.Sum) != dim {
		t.Errorf("a buffer of the wrong length was used: %d elements", len(res.Sum))
	}
}

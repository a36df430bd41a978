package privacyaudit

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// FuzzEpsilonLowerBound: no input panics; an error is ErrInvalid; a result
// is a finite multiple of Tolerance in [0, 1024] whose p-value is below β
// (or 0), and the ceiling is at least it. Valid r above 4096 are skipped
// to keep each input fast (larger r are covered by the unit tests).
func FuzzEpsilonLowerBound(f *testing.F) {
	f.Add(100, 100, 75, 0.0, 0.05)
	f.Add(1000, 100, 75, 1e-4, 0.05)
	f.Add(0, 0, 0, math.NaN(), 2.0)
	f.Add(math.MaxInt, math.MaxInt, math.MinInt, 1.0, 0.0)
	f.Fuzz(func(t *testing.T, m, r, v int, delta, beta float64) {
		if r > 4096 && r <= MaxGuesses && r <= m {
			t.Skip()
		}
		got, err := EpsilonLowerBound(m, r, v, delta, beta)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if !(got >= 0 && got <= 1024) || math.Mod(got, Tolerance) != 0 {
			t.Fatalf("EpsilonLowerBound(%d, %d, %d, %v, %v) = %v", m, r, v, delta, beta, got)
		}
		if got > 0 {
			if p, _ := PValue(m, r, v, got, delta); !(p < beta) {
				t.Fatalf("p-value %v at the bound %v, not below β = %v", p, got, beta)
			}
		}
		if c, err := Ceiling(m, r, delta, beta); err != nil || c < got {
			t.Fatalf("Ceiling = %v, %v, below the bound %v", c, err, got)
		}
	})
}

func FuzzBinomialTail(f *testing.F) {
	f.Add(10, 3, 0.5)
	f.Add(-1, 0, math.NaN())
	f.Add(MaxGuesses, MaxGuesses, 1e-300)
	f.Fuzz(func(t *testing.T, r, v int, p float64) {
		if r > 4096 {
			r %= 4096
		}
		got := BinomialTail(r, v, p)
		valid := r >= 0 && p >= 0 && p <= 1
		if valid != !math.IsNaN(got) || valid && !(got >= 0 && got <= 1+1e-12) {
			t.Fatalf("BinomialTail(%d, %d, %v) = %v", r, v, p, got)
		}
	})
}

// FuzzGuess reads scores (8 bytes each) from data; included is the low
// bit of each score's first byte.
func FuzzGuess(f *testing.F) {
	f.Add([]byte("0123456789abcdef01234567"), 1, 1)
	f.Add([]byte{}, 0, 0)
	f.Fuzz(func(t *testing.T, data []byte, kPlus, kMinus int) {
		n := len(data) / 8
		scores, included := make([]float64, n), make([]bool, n)
		for i := range n {
			scores[i] = math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:]))
			included[i] = data[8*i]&1 == 1
		}
		r, v, err := Guess(scores, included, kPlus, kMinus)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if r != kPlus+kMinus || v < 0 || v > r {
			t.Fatalf("Guess = %d, %d for kPlus = %d, kMinus = %d", r, v, kPlus, kMinus)
		}
	})
}

// FuzzGDPLowerBound: no input panics; an error is ErrInvalid; a result is
// a multiple of Tolerance in [0, 64) that the test rejects (or 0), the
// next grid point is not rejected, and the ceiling is at least it. Valid
// r above 4096 are skipped to keep each input fast.
func FuzzGDPLowerBound(f *testing.F) {
	f.Add(1000, 100, 80, 0.05)
	f.Add(1, 1, 1, 0.5)
	f.Add(0, 0, 0, math.NaN())
	f.Add(math.MaxInt, math.MaxInt, math.MinInt, 0.0)
	f.Fuzz(func(t *testing.T, m, r, v int, beta float64) {
		if r > 4096 && r <= MaxGuesses && r <= m {
			t.Skip()
		}
		got, err := GDPLowerBound(m, r, v, beta)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if !(got >= 0 && got < maxGDP) || math.Mod(got, Tolerance) != 0 {
			t.Fatalf("GDPLowerBound(%d, %d, %d, %v) = %v", m, r, v, beta, got)
		}
		if got > 0 && !gdpRejects(m, r, v, got, beta) || gdpRejects(m, r, v, got+Tolerance, beta) {
			t.Fatalf("GDPLowerBound(%d, %d, %d, %v) = %v is not the edge of the rejected set", m, r, v, beta, got)
		}
		if c, err := GDPLowerBound(m, r, r, beta); err != nil || c < got {
			t.Fatalf("ceiling %v, %v below the bound %v", c, err, got)
		}
	})
}

// FuzzGDPEpsilon: no input panics; an error is ErrInvalid; a result is a
// finite multiple of Tolerance, 0 or with δ_μ above δ there, and δ_μ at
// most δ one grid step above.
func FuzzGDPEpsilon(f *testing.F) {
	f.Add(1.0, 1e-5)
	f.Add(0.0, 0.5)
	f.Add(math.Inf(1), 0.0)
	f.Add(1e-300, 1e-300)
	f.Add(60.0, 0.999)
	f.Fuzz(func(t *testing.T, mu, delta float64) {
		got, err := GDPEpsilon(mu, delta)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if !(got >= 0) || math.IsInf(got, 0) || math.Mod(got, Tolerance) != 0 {
			t.Fatalf("GDPEpsilon(%v, %v) = %v", mu, delta, got)
		}
		if mu > 0 && got > 0 && !(GDPDelta(mu, got) > delta) {
			t.Fatalf("GDPEpsilon(%v, %v) = %v, but δ_μ there is %v", mu, delta, got, GDPDelta(mu, got))
		}
		if mu > 0 && got < 1000 && GDPDelta(mu, got+Tolerance) > delta {
			t.Fatalf("GDPEpsilon(%v, %v) = %v, but δ_μ one step above is %v", mu, delta, got, GDPDelta(mu, got+Tolerance))
		}
	})
}

// FuzzCurveRejects: no input panics; an error is ErrInvalid; the profile's
// g stays in [0, 1] and nondecreasing on a few points, and the test gives
// the same answer twice (no NaN-dependent branch). Valid r above 4096 are
// skipped as in FuzzEpsilonLowerBound.
func FuzzCurveRejects(f *testing.F) {
	f.Add(1000, 100, 80, 1.0, 1e-5, 0.05)
	f.Add(10, 10, 10, 0.0, 0.0, 0.5)
	f.Add(1, 1, 1, math.Inf(1), math.NaN(), 1e-300)
	f.Add(MaxGuesses, 1, 0, 700.0, 1.0, 0.999)
	f.Fuzz(func(t *testing.T, m, r, v int, eps, delta, beta float64) {
		if r > 4096 && r <= MaxGuesses && r <= m {
			t.Skip()
		}
		g := ProfileInverseTradeoff([]EpsDelta{{eps, delta}, {eps / 2, min(1, 2*delta)}, {0, 0.5}})
		prev := 0.0
		for _, x := range []float64{math.Inf(-1), -1, 0, 1e-300, 1e-6, 0.1, 0.5, 0.9, 1, 2, math.NaN()} {
			y := g(x)
			if !(y >= 0 && y <= 1) || (!math.IsNaN(x) && y < prev) {
				t.Fatalf("g(%v) = %v (previous %v)", x, y, prev)
			}
			if !math.IsNaN(x) {
				prev = y
			}
		}
		got, err := CurveRejects(m, r, v, g, beta)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		nan, _ := CurveRejects(m, r, v, func(float64) float64 { return math.NaN() }, beta)
		if again, _ := CurveRejects(m, r, v, g, beta); again != got || nan && v < r/2 {
			t.Fatalf("CurveRejects(%d, %d, %d): %v then %v; with a NaN g %v", m, r, v, got, again, nan)
		}
	})
}

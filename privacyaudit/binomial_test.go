package privacyaudit

import (
	"math"
	"math/big"
	"testing"
)

// exactTail returns P[Binomial(r, p) ≥ v] as an exact rational: a float64
// p is a/D with D a power of two, so the tail is Σ C(r,j)·a^j·(D−a)^(r−j)
// over D^r, summed in integers.
func exactTail(r, v int, p float64) *big.Rat {
	pr := new(big.Rat).SetFloat64(p)
	a, d := pr.Num(), pr.Denom()
	b := new(big.Int).Sub(d, a)
	num := new(big.Int)
	for j := max(v, 0); j <= r; j++ {
		term := new(big.Int).Binomial(int64(r), int64(j))
		term.Mul(term, new(big.Int).Exp(a, big.NewInt(int64(j)), nil))
		term.Mul(term, new(big.Int).Exp(b, big.NewInt(int64(r-j)), nil))
		num.Add(num, term)
	}
	return new(big.Rat).SetFrac(num, new(big.Int).Exp(d, big.NewInt(int64(r)), nil))
}

// floatTail is exactTail in 512-bit floating point, for r too large for
// rationals: each of its few hundred thousand operations errs by at most 2⁻⁵¹¹ relative.
func floatTail(r, v int, p float64) *big.Float {
	const prec = 512
	pf := new(big.Float).SetPrec(prec).SetFloat64(p)
	qf := new(big.Float).SetPrec(prec).Sub(big.NewFloat(1).SetPrec(prec), pf)
	sum := new(big.Float).SetPrec(prec)
	for j := max(v, 0); j <= r; j++ {
		term := new(big.Float).SetPrec(prec).SetInt(new(big.Int).Binomial(int64(r), int64(j)))
		term.Mul(term, floatPow(pf, j, prec))
		term.Mul(term, floatPow(qf, r-j, prec))
		sum.Add(sum, term)
	}
	return sum
}

func floatPow(x *big.Float, n int, prec uint) *big.Float {
	out := new(big.Float).SetPrec(prec).SetFloat64(1)
	base := new(big.Float).SetPrec(prec).Set(x)
	for ; n > 0; n >>= 1 {
		if n&1 == 1 {
			out.Mul(out, base)
		}
		base.Mul(base, base)
	}
	return out
}

// errorBound is BinomialTail's documented relative error bound.
func errorBound(r int, p, got float64) float64 {
	const u = 0x1p-53
	lg, _ := math.Lgamma(float64(r) + 1)
	l := max(math.Abs(math.Log(p)), math.Abs(math.Log1p(-p)))
	return u * (8*lg + 6*float64(r)*l + math.Abs(math.Log(got)) + float64(r+1) + 8)
}

// relErr returns |got − want|/want, with want exact.
func relErr(got float64, want *big.Float) float64 {
	w, _ := want.Float64()
	if w == 0 {
		return math.Abs(got)
	}
	d := new(big.Float).SetPrec(want.Prec()).SetFloat64(got)
	d.Sub(d, want).Quo(d, want)
	f, _ := d.Float64()
	return math.Abs(f)
}

var testProbabilities = []float64{0.5, 0.3, 0.1, 1e-3, 0.999, 0.7310585786300049 /* e/(1+e) */, 0.95257412682243336 /* e³/(1+e³) */}

// Every tail of Binomial(r, p) for r ≤ 40 against exact rational
// arithmetic: within the documented bound, and within 1e-13 relative (the
// bound there is below 5e-13).
func TestBinomialTailExactSmall(t *testing.T) {
	for r := 0; r <= 40; r++ {
		for _, p := range testProbabilities {
			for v := -1; v <= r+1; v++ {
				got := BinomialTail(r, v, p)
				want := new(big.Float).SetPrec(256).SetRat(exactTail(r, v, p))
				e := relErr(got, want)
				if e > errorBound(r, p, got) || e > 1e-13 {
					t.Errorf("BinomialTail(%d, %d, %v) = %v, exact %v: relative error %.3g, bound %.3g", r, v, p, got, want.Text('g', 20), e, errorBound(r, p, got))
				}
			}
		}
	}
}

// Large r, including far tails down to 1e-300 and below, against 512-bit
// arithmetic.
func TestBinomialTailExactLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("slow exact reference")
	}
	for _, r := range []int{1000, 2000} {
		for _, p := range []float64{0.5, 0.7310585786300049, 0.01} {
			for _, v := range []int{1, r / 100, r / 2, 3 * r / 4, 9 * r / 10, r - 1, r} {
				got := BinomialTail(r, v, p)
				want := floatTail(r, v, p)
				if got < 0x1p-1022 {
					w, _ := want.Float64()
					if math.Abs(got-w) > 0x1p-1074*4 {
						t.Errorf("BinomialTail(%d, %d, %v) = %v, exact %v (subnormal range)", r, v, p, got, w)
					}
					continue
				}
				if e := relErr(got, want); e > errorBound(r, p, got) {
					t.Errorf("BinomialTail(%d, %d, %v) = %v, exact %s: relative error %.3g over the bound %.3g", r, v, p, got, want.Text('g', 20), e, errorBound(r, p, got))
				}
			}
		}
	}
}

func TestBinomialTailKnownValues(t *testing.T) {
	for _, c := range []struct {
		r, v int
		p    float64
		want float64
		tol  float64 // relative; its source in the name
		name string
	}{
		{10, 8, 0.5, 56.0 / 1024, 2e-14, "(45+10+1)/2¹⁰, exact; tol is the documented bound"},
		{1000, 1000, 0.5, 0x1p-1000, 1e-12, "2⁻¹⁰⁰⁰, exact"},
		{1, 1, 0.25, 0.25, 1e-15, "one trial"},
		{100, 75, 0.75, 0.553, 1e-3, "App. D's p ≈ 0.553 at m = r = 100, v = 75, ε = ln 3"},
		{20, 0, 0.3, 1, 0, "v = 0"},
		{20, 21, 0.3, 0, 0, "v > r"},
		{20, 1, 0, 0, 0, "p = 0"},
		{20, 20, 1, 1, 0, "p = 1"},
	} {
		got := BinomialTail(c.r, c.v, c.p)
		if math.Abs(got-c.want) > c.tol*c.want {
			t.Errorf("%s: BinomialTail(%d, %d, %v) = %v, want %v", c.name, c.r, c.v, c.p, got, c.want)
		}
	}
}

func TestBinomialTailInvalid(t *testing.T) {
	for _, c := range []struct {
		r, v int
		p    float64
	}{
		{-1, 0, 0.5}, {MaxGuesses + 1, 1, 0.5}, {10, 3, math.NaN()}, {10, 3, -0.1}, {10, 3, 1.5}, {10, 3, math.Inf(1)},
	} {
		if got := BinomialTail(c.r, c.v, c.p); !math.IsNaN(got) {
			t.Errorf("BinomialTail(%d, %d, %v) = %v, want NaN", c.r, c.v, c.p, got)
		}
	}
}

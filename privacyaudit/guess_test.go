package privacyaudit

import (
	"errors"
	"math"
	"testing"
)

func TestGuess(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		name          string
		scores        []float64
		included      []bool
		kPlus, kMinus int
		wantR, wantV  int
	}{
		{"perfect", []float64{0.9, 0.1, 0.8, 0.2}, []bool{true, false, true, false}, 2, 2, 4, 4},
		{"all wrong", []float64{0.9, 0.1, 0.8, 0.2}, []bool{false, true, false, true}, 1, 1, 2, 0},
		{"abstain all", []float64{0.9, 0.1}, []bool{true, false}, 0, 0, 0, 0},
		{"in only", []float64{3, 1, 2}, []bool{false, true, true}, 2, 0, 2, 1},
		// Ties: order is 0,1,2,3 (all equal): index 0 guessed in, index 3 out.
		{"ties by index", []float64{1, 1, 1, 1}, []bool{true, false, false, false}, 1, 1, 2, 2},
		{"ties by index, other side", []float64{1, 1, 1, 1}, []bool{false, false, false, true}, 1, 1, 2, 0},
		{"infinities", []float64{-inf, inf, 0}, []bool{false, true, true}, 1, 1, 2, 2},
		{"empty", nil, nil, 0, 0, 0, 0},
	} {
		r, v, err := Guess(c.scores, c.included, c.kPlus, c.kMinus)
		if err != nil || r != c.wantR || v != c.wantV {
			t.Errorf("%s: Guess = %d, %d, %v; want %d, %d", c.name, r, v, err, c.wantR, c.wantV)
		}
	}
}

func TestGuessInvalid(t *testing.T) {
	for _, c := range []struct {
		name          string
		scores        []float64
		included      []bool
		kPlus, kMinus int
	}{
		{"lengths", []float64{1, 2}, []bool{true}, 1, 0},
		{"kPlus < 0", []float64{1, 2}, []bool{true, false}, -1, 0},
		{"kMinus < 0", []float64{1, 2}, []bool{true, false}, 0, -1},
		{"too many", []float64{1, 2}, []bool{true, false}, 2, 1},
		{"overflowing sum", []float64{1, 2}, []bool{true, false}, 1, math.MaxInt},
		{"NaN score", []float64{1, math.NaN()}, []bool{true, false}, 1, 0},
	} {
		if _, _, err := Guess(c.scores, c.included, c.kPlus, c.kMinus); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", c.name, err)
		}
	}
}

package dataset

import (
	"math"
	"testing"
)

func TestSharedRows(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	train := &Dataset{X: []float32{1, 2, 0, 4, 5, 6}, Y: []int32{0, 1, 2}, Dim: 2, Classes: 3}
	for _, tc := range []struct {
		name string
		eval *Dataset
		want int
	}{
		{"the training set", train, 3},
		{"disjoint", &Dataset{X: []float32{7, 8, 9, 10}, Y: []int32{0, 1}, Dim: 2, Classes: 3}, 0},
		{"same features, other label", &Dataset{X: []float32{1, 2}, Y: []int32{1}, Dim: 2, Classes: 3}, 0},
		{"-0 is +0", &Dataset{X: []float32{negZero, 4}, Y: []int32{1}, Dim: 2, Classes: 3}, 1},
		{"a training row twice, one new row", &Dataset{X: []float32{5, 6, 5, 6, 1, 1}, Y: []int32{2, 2, 0}, Dim: 2, Classes: 3}, 2},
		{"other Dim", &Dataset{X: []float32{1, 2, 0, 4, 5, 6}, Y: []int32{0, 1}, Dim: 3, Classes: 3}, 0},
		{"empty", &Dataset{Dim: 2, Classes: 3}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SharedRows(train, tc.eval); got != tc.want {
				t.Errorf("SharedRows = %d, want %d", got, tc.want)
			}
		})
	}
}

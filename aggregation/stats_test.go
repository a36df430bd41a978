package aggregation

import (
	"math"
	"testing"
)

// TestStatsOfSpecialValues: statsOf flags NaNs (any payload, either sign)
// and infinities apart, and sums the squares of exactly the finite values,
// in order, as float64.
func TestStatsOfSpecialValues(t *testing.T) {
	finite := []float32{3, -4, math.MaxFloat32, math.SmallestNonzeroFloat32, float32(math.Copysign(0, -1))}
	var want float64
	for _, f := range finite {
		want += float64(f) * float64(f)
	}
	if st := statsOf(finite); st.ss != want || st.nan || st.inf {
		t.Fatalf("finite values: %+v, want ss %v", st, want)
	}
	for _, tc := range []struct {
		bits     uint32
		nan, inf bool
	}{{0x7f800000, false, true}, {0xff800000, false, true}, {0x7fc00000, true, false}, {0xff800001, true, false}, {0x7fffffff, true, false}} {
		st := statsOf(append([]float32{math.Float32frombits(tc.bits)}, finite...))
		if st.nan != tc.nan || st.inf != tc.inf || st.ss != want {
			t.Errorf("%08x: %+v, want nan %v inf %v ss %v", tc.bits, st, tc.nan, tc.inf, want)
		}
	}
}

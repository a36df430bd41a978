package node

import (
	"math"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/transport"
)

// TestCheckParamsNonFinite: checkParams refuses exactly the vectors with a
// NaN (any payload, either sign) or an infinity, naming the first, and
// accepts every finite value, the largest and the subnormals included.
func TestCheckParamsNonFinite(t *testing.T) {
	finite := []float32{0, float32(math.Copysign(0, -1)), math.MaxFloat32, -math.MaxFloat32,
		math.SmallestNonzeroFloat32, math.Float32frombits(0x007fffff), 1, -1e-30}
	if err := checkParams(finite, len(finite)); err != nil {
		t.Fatalf("finite values refused: %v", err)
	}
	for _, bad := range []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0xffffffff} {
		v := append(transport.Vector{}, finite...)
		v[5] = math.Float32frombits(bad)
		err := checkParams(v, len(v))
		if err == nil || !strings.Contains(err.Error(), "index 5") {
			t.Errorf("%08x at index 5: %v", bad, err)
		}
		if x := float64(v[5]); !math.IsNaN(x) && !math.IsInf(x, 0) {
			t.Errorf("%08x is finite: the test's list is wrong", bad)
		}
	}
	if err := checkParams(finite, len(finite)+1); err == nil {
		t.Error("a vector of the wrong length was accepted")
	}
}

//go:build dpbrokenmechanism

package coordinator

import (
	"math"
	"testing"
)

// TestBreakMechanismQuartersTheNoise: with -tags dpbrokenmechanism and
// the environment variable set, g̃ = (S + z)/B becomes (S + z/4)/B;
// without the variable it is unchanged.
func TestBreakMechanismQuartersTheNoise(t *testing.T) {
	sum, b := []float64{8, -4}, 4.0
	z := []float64{2, 6}
	g := []float32{float32((sum[0] + z[0]) / b), float32((sum[1] + z[1]) / b)}
	breakMechanism(g, sum, b) // variable unset
	if g[0] != 2.5 || g[1] != 0.5 {
		t.Fatalf("unset: g̃ %v, want unchanged", g)
	}
	t.Setenv(BrokenMechanismEnv, BrokenSigmaQuarter)
	breakMechanism(g, sum, b)
	for j := range g {
		if want := (sum[j] + z[j]/4) / b; math.Abs(float64(g[j])-want) > 1e-6 {
			t.Errorf("g̃[%d] = %v, want %v", j, g[j], want)
		}
	}
}

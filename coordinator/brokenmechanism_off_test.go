//go:build !dpbrokenmechanism

package coordinator

import (
	"slices"
	"testing"
)

// TestBreakMechanismIsANoOpInProductBuilds: without -tags
// dpbrokenmechanism, BrokenMechanismEnv changes no g̃ (e2e's
// TestAuditCatchesBrokenMechanism checks the same through a product
// binary's audit).
func TestBreakMechanismIsANoOpInProductBuilds(t *testing.T) {
	t.Setenv(BrokenMechanismEnv, BrokenSigmaQuarter)
	g := []float32{1.5, -2, 0.25}
	want := slices.Clone(g)
	breakMechanism(g, []float64{1, 1, 1}, 4)
	if !slices.Equal(g, want) {
		t.Fatalf("g̃ %v, want %v unchanged", g, want)
	}
}

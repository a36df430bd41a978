//go:build !dpbrokenmechanism

package brokenmech

import "testing"

// TestProductBuildsCannotBeBroken: without the build tag, no value of
// Env turns a breakage on.
func TestProductBuildsCannotBeBroken(t *testing.T) {
	for _, v := range []string{SigmaQuarter, ClipTriple} {
		t.Setenv(Env, v)
		if Is(v) {
			t.Fatalf("%s=%s: Is(%q) true in a build without -tags dpbrokenmechanism", Env, v, v)
		}
	}
}

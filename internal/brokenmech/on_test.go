//go:build dpbrokenmechanism

package brokenmech

import "testing"

// TestTaggedBuildsFollowTheVariable: with the build tag, Is follows Env.
func TestTaggedBuildsFollowTheVariable(t *testing.T) {
	t.Setenv(Env, ClipTriple)
	if !Is(ClipTriple) || Is(SigmaQuarter) {
		t.Fatalf("%s=%s: Is(clip*3) %v, Is(sigma/4) %v", Env, ClipTriple, Is(ClipTriple), Is(SigmaQuarter))
	}
	t.Setenv(Env, "")
	if Is(ClipTriple) || Is(SigmaQuarter) {
		t.Fatal("unset: a breakage is on")
	}
}

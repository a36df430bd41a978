//go:build !dpbrokenmechanism

package brokenmech

// Is is false: this binary was built without -tags dpbrokenmechanism, and
// its mechanism cannot be broken.
func Is(string) bool { return false }

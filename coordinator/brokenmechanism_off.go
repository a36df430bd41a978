//go:build !dpbrokenmechanism

package coordinator

// breakMechanism does nothing: the mechanism can be broken on purpose
// only in binaries built with -tags dpbrokenmechanism
// (brokenmechanism_on.go), for the audit's broken-mechanism test.
func breakMechanism([]float32, []float64, float64) {}

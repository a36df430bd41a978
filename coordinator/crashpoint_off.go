//go:build !dpcrashpoints

package coordinator

// crashPoint does nothing: crash points exist only in binaries built with
// -tags dpcrashpoints (crashpoint_on.go), for the process-level tests.
func crashPoint(string, int64) {}

//go:build dpbrokenmechanism

package brokenmech

import "os"

// Is reports whether Env names the breakage v. It reads the variable on
// every call, so a test may set it at any time.
func Is(v string) bool { return os.Getenv(Env) == v }

//go:build race

package cli

// raceEnabled is true under -race (see race_off_test.go).
const raceEnabled = true

//go:build race

package accounting

// raceEnabled is true under -race (see race_off_test.go).
const raceEnabled = true

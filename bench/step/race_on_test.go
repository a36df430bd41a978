//go:build race

package main

// raceEnabled is true under -race (see race_off_test.go).
const raceEnabled = true

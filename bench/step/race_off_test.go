//go:build !race

package main

// raceEnabled is false without -race (skipUnderRace).
const raceEnabled = false

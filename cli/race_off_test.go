//go:build !race

package cli

// raceEnabled is false without -race (skipUnderRace).
const raceEnabled = false

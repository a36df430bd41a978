//go:build !race

package accounting

// raceEnabled is false without -race. The PLD robustness sweeps (numeric
// code with no concurrency, a minute without the race detector and ten
// under it) run only without it: .ci/run runs them in a step of their own.
const raceEnabled = false

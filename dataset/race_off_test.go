//go:build !race

package dataset

// raceEnabled is false without -race. Tests use it to shrink work whose
// cost the race detector multiplies twentyfold (decompressing and
// converting 47 MB of pixels) while keeping every assertion.
const raceEnabled = false

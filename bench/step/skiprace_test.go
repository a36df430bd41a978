package main

// skipUnderRace skips t under the race detector: a long test that runs
// whole trainings for their numbers, with no concurrency of its own
// beyond what the other tests run under -race. .ci/run runs it without
// the detector, in its step "long tests without -race".
func skipUnderRace(t interface{ Skip(...any) }) {
	if raceEnabled {
		t.Skip("a whole training for its numbers: runs without -race (.ci/run, \"long tests without -race\")")
	}
}

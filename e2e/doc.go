// Package e2e holds dpcluster's process-level tests: the real coordinator
// and node binaries, and a NATS server (./natsserver), each run as its own
// OS process on loopback ports, killed, paused and restarted with signals
// the way an operator or a crash would, and (TestProcessNetworkSoak)
// talking to each other only through fault-injecting TCP proxies
// (internal/faultnet) that cut, delay and half-open their connections.
//
// The package has no exported API. Its test harness (harness_test.go)
// builds the binaries once per test binary run with `go build` (so the go
// tool must be on PATH), gives every process a log file under the test's
// temporary directory, waits by polling with deadlines, and kills every
// child in t.Cleanup. The tests of whole runs are named TestProcess*:
//
//	go test -race -run 'TestProcess' -v ./e2e
//
// The binaries are built without -race, whatever flags the test binary
// has: the tests check the processes' behaviour, not their memory model.
package e2e

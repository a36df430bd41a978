package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain lets the test binary act as the coordinator binary when
// DPCLUSTER_RUN_MAIN is set, so exit codes are tested on the real main.
func TestMain(m *testing.M) {
	if os.Getenv("DPCLUSTER_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runMain(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "DPCLUSTER_RUN_MAIN=1")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestExitCodes(t *testing.T) {
	out, _, code := runMain(t, "privacy", "epsilon", "--sample-rate", "0.004266666666666667",
		"--noise-multiplier", "1.1", "--steps", "14062", "--delta", "1e-5")
	if code != 0 || !strings.Contains(out, "ε = 2.5966") {
		t.Errorf("valid input: exit %d, stdout %q", code, out)
	}
	_, errOut, code := runMain(t, "privacy", "epsilon", "--sample-rate", "2",
		"--noise-multiplier", "1.1", "--steps", "10")
	if code == 0 || !strings.Contains(errOut, "sample rate") {
		t.Errorf("q = 2: exit %d, stderr %q; want non-zero and a message about the sample rate", code, errOut)
	}
}

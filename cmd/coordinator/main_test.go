package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/model"
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

// TestDeviceExitCode: a --device this binary cannot use stops `local` at
// startup with a non-zero exit and model.OpenDevice's reason.
func TestDeviceExitCode(t *testing.T) {
	want := map[string]string{"tpu:0": `unknown device "tpu:0"`}
	if !model.CUDAAvailable() {
		want["cuda:0"] = "this binary was built without CUDA support (build it with -tags cuda; see docs/GPU.md)"
	}
	for dev, msg := range want {
		dir := filepath.Join(t.TempDir(), "run")
		_, errOut, code := runMain(t, "local", "--device", dev, "--data-dir", dir, "--progress", "off")
		if code == 0 || !strings.Contains(errOut, msg) {
			t.Errorf("--device %s: exit %d, stderr %q; want non-zero and %q", dev, code, errOut, msg)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--device %s: the data dir was created (%v): the device must fail first", dev, err)
		}
	}
}

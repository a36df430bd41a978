package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/model"
)

// TestMain lets the test binary act as the node binary when
// DPCLUSTER_RUN_MAIN is set, so exit codes are tested on the real main.
func TestMain(m *testing.M) {
	if os.Getenv("DPCLUSTER_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDeviceExitCode: a --device this binary cannot use stops the node at
// startup, before it loads data or dials NATS (port 1 never answers), with
// a non-zero exit and model.OpenDevice's reason.
func TestDeviceExitCode(t *testing.T) {
	runFile := t.TempDir() + "/run.yaml"
	if err := os.WriteFile(runFile, []byte("run: exit\nmodel: logreg\ndataset: gaussian\nbatch_size: 100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"tpu:0": `unknown device "tpu:0"`}
	if !model.CUDAAvailable() {
		want["cuda:0"] = "this binary was built without CUDA support (build it with -tags cuda; see docs/GPU.md)"
	}
	for dev, msg := range want {
		cmd := exec.Command(os.Args[0], "--device", dev, "--config", runFile, "--nats", "nats://127.0.0.1:1")
		cmd.Env = append(os.Environ(), "DPCLUSTER_RUN_MAIN=1")
		var errOut strings.Builder
		cmd.Stderr = &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 || !strings.Contains(errOut.String(), msg) {
			t.Errorf("--device %s: %v, stderr %q; want a non-zero exit and %q", dev, err, errOut.String(), msg)
		}
	}
}

// Package torchref runs the reference BERT and GPT-2 models written in
// plain PyTorch (pretrained/testdata/torchref.py) for the tests that
// compare the engine with them, and finds the python3 that the tests
// running Python need. It is test support: it needs Debian's
// python3-torch (or, for RequireNumpy, python3-numpy), and skips (or,
// with DPCLUSTER_CI set, fails) a test where that is missing.
package torchref

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Script is the path of torchref.py, found beside this package's source.
func Script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "pretrained", "testdata", "torchref.py")
}

// Python returns a python3 that imports torch ($DPCLUSTER_PYTHON, Debian's
// /usr/bin/python3, or the python3 on PATH), or "".
func Python() string { return PythonWith("torch") }

// PythonWith returns the first python3 of $DPCLUSTER_PYTHON, Debian's
// /usr/bin/python3 and the python3 on PATH that imports every module (a
// PATH python3 may be another installation without Debian's packages), or
// "".
func PythonWith(modules ...string) string {
	for _, p := range []string{os.Getenv("DPCLUSTER_PYTHON"), "/usr/bin/python3", "python3"} {
		if p != "" && Imports(p, modules...) {
			return p
		}
	}
	return ""
}

// Imports reports whether the python3 py imports every module.
func Imports(py string, modules ...string) bool {
	return exec.Command(py, "-c", "import "+strings.Join(append([]string{"sys"}, modules...), ", ")).Run() == nil
}

// Require returns a python3 with torch, or skips the test without one;
// with DPCLUSTER_CI set (CI, whose scripts/lib/setup.sh installs
// python3-torch) it fails instead.
func Require(t testing.TB) string {
	t.Helper()
	return require(t, "torch", "python3-torch")
}

// RequireNumpy returns a python3 with numpy, or skips the test without
// one (fails with DPCLUSTER_CI set, as Require does).
func RequireNumpy(t testing.TB) string {
	t.Helper()
	return require(t, "numpy", "python3-numpy")
}

// require returns a python3 that imports module, or skips (fails in CI)
// naming the Debian package that provides it.
func require(t testing.TB, module, pkg string) string {
	t.Helper()
	py := PythonWith(module)
	if py == "" {
		msg := "needs python3 with " + module + " (Debian: apt-get install " + pkg + ")"
		if os.Getenv("DPCLUSTER_CI") != "" {
			t.Fatal("DPCLUSTER_CI is set but no python3 imports " + module + ": " + msg)
		}
		t.Skip(msg + "; never skipped in CI")
	}
	return py
}

// Run runs torchref.py with args under py and returns its standard
// output; a failure fails the test with the script's error output.
func Run(t testing.TB, py string, args ...string) string {
	t.Helper()
	cmd := exec.Command(py, append([]string{Script()}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("torchref.py %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out)
}

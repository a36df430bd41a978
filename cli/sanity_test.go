package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalRefusesOutlierLabel: one mistyped integer label (50000 among
// 0…2) does not build a 50,001-class model; the load fails naming the
// label, its row and the flags that override it.
func TestLocalRefusesOutlierLabel(t *testing.T) {
	dir := t.TempDir()
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	_, rest, _ := strings.Cut(lines[6], ",")
	lines[6] = "50000," + rest // data row 7
	bad := filepath.Join(dir, "typo.csv")
	writeFile(t, bad, strings.Join(lines, "\n"))
	args := []string{"local", "--data-path", bad, "--model", "logreg", "--batch-size", "60", "--max-steps", "2",
		"--nodes", "1", "--data-dir", t.TempDir(), "--run", "t-typo", "--progress", "off"}
	_, _, err = runCmd(t, args...)
	if err == nil {
		t.Fatal("a run with one label of 50000 among 0…2 started; want the load refused")
	}
	for _, want := range []string{"label 50000 in data row 7 would make 50001 classes", "--classes", "--labels"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q is more than one line", err)
	}
}

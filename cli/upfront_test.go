package cli

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/raftlog"
)

// TestBadInputsRefusedUpFront is issue 26's list of inputs that failed
// late, silently or with a confusing message: each is now a one-line error
// that names the flag (or run-file key) and the value as given, before any
// data is loaded.
func TestBadInputsRefusedUpFront(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "spec.json")
	writeFile(t, spec, `{"name":"x","input":[784],"classes":10,"layers":[{"type":"linear","out":10}]}`)
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "bogus_key: 3\n")
	txt := filepath.Join(dir, "notes.txt")
	writeFile(t, txt, "some text\n")
	both := filepath.Join(dir, "both.yaml")
	writeFile(t, both, "model: cnn\nmodel_spec: "+spec+"\n")
	cases := []struct {
		name    string
		args    []string
		want    []string
		notWant string
	}{
		{"negative target epsilon", []string{"--target-epsilon", "-1"}, []string{"--target-epsilon -1:", "positive"}, "0.999999999"},
		{"infinite target epsilon", []string{"--target-epsilon", "+Inf"}, []string{"--target-epsilon +Inf:"}, ""},
		{"preset and spec", []string{"--model", "cnn", "--model-spec", spec}, []string{"--model cnn", "--model-spec " + spec}, ""},
		{"preset and spec in the run file", []string{"--config", both}, []string{"--model cnn", "--model-spec " + spec}, ""},
		{"missing data directory", []string{"--data", filepath.Join(dir, "nonexistent")}, []string{"--data " + filepath.Join(dir, "nonexistent") + ":", "no such directory"}, ""},
		{"directory without the data", []string{"--data", dir}, []string{"--data " + dir + ":", "no Fashion-MNIST files"}, ""},
		{"unknown run-file key", []string{"--config", bad}, []string{`unknown key "bogus_key"`, "line 1", "target_epsilon"}, "cli.runSpec"},
		{"negative learning rate", []string{"--lr", "-1"}, []string{"--lr -1:", "LearningRate = -1, want > 0"}, ""},
		{"unknown algorithm", []string{"--algorithm", "adam"}, []string{"--algorithm adam:", `unknown algorithm "adam"`, "dp-adam"}, ""},
		{"beta2 of one", []string{"--beta2", "1"}, []string{"--beta2 1:", "want in [0, 1)"}, ""},
		{"zero batch size", []string{"--batch-size", "0"}, []string{"--batch-size 0:", "positive"}, ""},
		{"clip norm out of range", []string{"--clip", "0"}, []string{"--clip 0:"}, ""},
		{"missing data file", []string{"--data-path", filepath.Join(dir, "none.csv")}, []string{"--data-path " + filepath.Join(dir, "none.csv") + ": no such file"}, ""},
		{"unknown data format", []string{"--data-path", txt}, []string{"--data-path " + txt + ":", ".csv", ".parquet"}, ""},
		{"sigma that cannot reach max steps", []string{"--sigma", "1", "--target-epsilon", "0.1", "--max-steps", "1000"},
			[]string{"--sigma 1 spends ε =", "over --max-steps 1000", "--target-epsilon 0.1"}, ""},
		{"own data without a schema", []string{"--dataset", "local"}, []string{"input_shape", "total_examples", "name the run"}, ""},
		{"classes and labels disagree", []string{"--data-path", txt, "--classes", "3", "--labels", "a,b"}, []string{"--classes 3 with 2 --labels"}, ""},
	}
	// A flag overrides the run file's choice, either way, with no error:
	// the file's spec and the flag's preset train the preset.
	specFile := filepath.Join(dir, "spec.yaml")
	writeFile(t, specFile, "model_spec: "+spec+"\n")
	s := defaultRunSpec()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	s.bind(fs)
	if err := fs.Parse([]string{"--model", "cnn"}); err != nil {
		t.Fatal(err)
	}
	if err := loadRunSpec(&s, specFile, fs); err != nil || s.Model != "cnn" || s.ModelSpec != "" {
		t.Fatalf("run file's spec, flag's preset: err %v, model %q, spec %q; want the preset", err, s.Model, s.ModelSpec)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"local", "--data-dir", filepath.Join(dir, "d-"+strings.ReplaceAll(tc.name, " ", "-")),
				"--progress", "off", "--max-steps", "5"}, tc.args...)
			_, stderr, err := runCmd(t, args...)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.notWant != "" && strings.Contains(err.Error(), tc.notWant) {
				t.Errorf("error %q mentions %q", err, tc.notWant)
			}
			if strings.Contains(stderr, "loading Fashion-MNIST") || strings.Contains(stderr, "searching on") {
				t.Errorf("data was loaded or searched for before the error:\n%s", stderr)
			}
		})
	}
}

// TestMetricsAddrInUseRefusedUpFront is issue 27's papercut: a taken
// --metrics-addr was found only after the data was loaded.
func TestMetricsAddrInUseRefusedUpFront(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	_, stderr, err := runCmd(t, "local", "--data-dir", t.TempDir(), "--progress", "off", "--max-steps", "5", "--metrics-addr", addr)
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr "+addr) {
		t.Fatalf("local with a taken metrics address: %v", err)
	}
	if strings.Contains(stderr, "loading Fashion-MNIST") || strings.Contains(stderr, "searching on") {
		t.Errorf("data was loaded or searched for before the error:\n%s", stderr)
	}
}

// TestDataDirInUseRefusedUpFront: a second coordinator on a data dir whose
// Raft log is open (here: held by the test) is refused before any data is
// loaded, with an error naming the directory and what to do.
func TestDataDirInUseRefusedUpFront(t *testing.T) {
	dir := t.TempDir()
	held, err := raftlog.Open(filepath.Join(dir, "raft"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, stderr, err := runCmd(t, "local", "--data-dir", dir, "--progress", "off", "--max-steps", "5")
	if err == nil || !strings.Contains(err.Error(), "--data-dir "+dir+": another coordinator is running on it") {
		t.Fatalf("local on a data dir in use: %v", err)
	}
	if strings.Contains(stderr, "loading Fashion-MNIST") || strings.Contains(stderr, "searching on") {
		t.Errorf("data was loaded or searched for before the error:\n%s", stderr)
	}
}

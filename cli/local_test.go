package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/seed"
)

// localArgs is a small, fast local run: logistic regression on the
// synthetic Gaussian mixture across 3 nodes.
func localArgs(dir string, extra ...string) []string {
	return append([]string{"local", "--dataset", "gaussian", "--model", "logreg",
		"--batch-size", "100", "--max-steps", "40", "--eval-every", "20", "--round-timeout", "20s",
		"--data-dir", dir, "--progress", "off", "--run", "t-local", "--json"}, extra...)
}

// TestLocalTrainsAndAudits runs `coordinator local` end to end in-process
// (embedded NATS, a real Raft replica, three nodes): it reaches the step
// limit at exactly the target ε, reports a test accuracy, and leaves a
// ledger that `coordinator ledger audit DIR --json` passes with one record
// per applied step. Running it again on the same data dir resumes a
// finished run: nothing more is charged.
func TestLocalTrainsAndAudits(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, localArgs(dir)...)
	if err != nil {
		t.Fatal(err)
	}
	var res localResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if res.Steps != 40 || res.Stopped != "max steps reached" || !res.Private || res.NoiseMode != coordinator.NoiseDiscrete {
		t.Errorf("result %+v", res)
	}
	// σ was calibrated so that 40 steps spend the whole budget.
	if res.Epsilon > res.TargetEpsilon || res.Epsilon < res.TargetEpsilon*(1-1e-6) {
		t.Errorf("ε = %v, target %v", res.Epsilon, res.TargetEpsilon)
	}
	if res.TestAccuracy == nil || !(*res.TestAccuracy > 0.1) || res.EvalData != "test" {
		t.Errorf("test accuracy %v (%s): missing or no better than chance", res.TestAccuracy, res.EvalData)
	}
	if res.Ledger != filepath.Join(dir, coordinator.LedgerFile) {
		t.Errorf("ledger at %s", res.Ledger)
	}
	aout, err := run(t, "ledger", "audit", dir, "--json", "--expect-steps", "40")
	if err != nil {
		t.Fatalf("audit failed: %v\n%s", err, aout)
	}
	var rep ledger.AuditReport
	if err := json.Unmarshal([]byte(aout), &rep); err != nil || !rep.OK || rep.Charges != 40 ||
		rep.Noise != seed.Crypto || !rep.Private || rep.Mechanism != ledger.MechanismDiscrete {
		t.Fatalf("audit report %+v, %v", rep, err)
	}

	// Resume the finished run: no new step, no new charge.
	out, err = run(t, localArgs(dir)...)
	if err != nil {
		t.Fatal(err)
	}
	var again localResult
	if err := json.Unmarshal([]byte(out), &again); err != nil || again.Steps != 40 {
		t.Fatalf("resumed run: %+v, %v", again, err)
	}
	if rep2, err := ledger.Audit(res.Ledger); err != nil || rep2.Charges != 40 {
		t.Errorf("after resume: %+v, %v", rep2, err)
	}

	// A different run configuration on the same data dir is refused.
	if _, err := run(t, localArgs(dir, "--lr", "0.5")...); err == nil || !strings.Contains(err.Error(), "different run") {
		t.Errorf("changed config on an existing data dir: err = %v", err)
	}
}

// TestLocalSeededIsReproducible: with --insecure-seed two runs produce the
// same ledger ε and test accuracy, and the output says it is not private.
func TestLocalSeededIsReproducible(t *testing.T) {
	var results []localResult
	for range 2 {
		out, err := run(t, localArgs(t.TempDir(), "--insecure-seed", "5", "--max-steps", "15")...)
		if err != nil {
			t.Fatal(err)
		}
		var res localResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	if results[0].Private || results[0].TestAccuracy == nil || results[1].TestAccuracy == nil ||
		*results[0].TestAccuracy != *results[1].TestAccuracy || *results[0].TestLoss != *results[1].TestLoss {
		t.Errorf("seeded runs differ or claim privacy: %+v vs %+v", results[0], results[1])
	}
}

// TestLocalConfigFile: a YAML run file sets the run; flags override it;
// unknown keys are an error.
func TestLocalConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "run.yaml")
	writeFile(t, cfg, "run: from-file\nmax_steps: 1000\nround_timeout: 20s\n")
	out, err := run(t, "local", "--config", cfg, "--dataset", "gaussian", "--model", "logreg",
		"--batch-size", "100", "--max-steps", "10", "--data-dir", filepath.Join(dir, "d"), "--progress", "off", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res localResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Run != "from-file" || res.Steps != 10 {
		t.Errorf("run %q steps %d: want the file's run name and the flag's max steps", res.Run, res.Steps)
	}
	writeFile(t, cfg, "run: x\nlearning_rate: 1\n")
	if _, err := run(t, "local", "--config", cfg, "--data-dir", filepath.Join(dir, "e")); err == nil || !strings.Contains(err.Error(), "learning_rate") {
		t.Errorf("unknown key: err = %v", err)
	}
}

func TestLocalFlagErrors(t *testing.T) {
	dir := t.TempDir()
	type flagCase struct {
		args []string
		want string
	}
	cases := []flagCase{
		{[]string{"--nodes", "0"}, "--nodes"},
		{[]string{"--dataset", "none"}, "needs a dataset"},
		{[]string{"--dataset", "mnist"}, `--dataset "mnist": must be one of`},
		{[]string{"--model", "nope"}, "--model"},
		{[]string{"--max-steps", "0"}, "max_steps"},
		{[]string{"--batch-size", "1e9"}, "batch_size"},
		{[]string{"--progress", "maybe"}, "--progress"},
		{[]string{"--target-epsilon", "-1"}, "epsilon"},
		{[]string{"--device", "gpu"}, `unknown device "gpu"`},
	}
	if !model.CUDAAvailable() {
		cases = append(cases, flagCase{[]string{"--device", "cuda:1"},
			`--device cuda:1: model: device not available: "cuda:1": this binary was built without CUDA support (build it with -tags cuda; see docs/GPU.md)`})
	}
	for _, tc := range cases {
		_, err := run(t, localArgs(filepath.Join(dir, "x"), tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	p, err := newProgress(&buf, "on", nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	p.now = func() time.Time { return now }
	p.update(coordinator.Progress{Step: 1, MaxSteps: 10, Epsilon: 0.5, TargetEpsilon: 3})
	now = now.Add(time.Second)
	p.update(coordinator.Progress{Step: 5, MaxSteps: 10, Epsilon: 1.25, TargetEpsilon: 3,
		EvalStep: 5, Eval: coordinator.Evaluation{Loss: 0.7, Accuracy: 0.8125, N: 100}, EvalData: coordinator.EvalPublic})
	p.finish()
	got := buf.String()
	for _, want := range []string{"[############............] step 5/10", "ε 1.250/3", "test acc 81.2% (step 5)", "5.0 steps/s"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress output %q lacks %q", got, want)
		}
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLocalInterrupted: cancelling the context (what SIGINT does) stops
// the run cleanly: no error, a resume hint, and a ledger that audits.
func TestLocalInterrupted(t *testing.T) {
	dir := t.TempDir()
	cmd := NewCoordinatorCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"local", "--dataset", "gaussian", "--model", "logreg", "--batch-size", "100",
		"--max-steps", "0", "--sigma", "5", "--data-dir", dir, "--progress", "off", "--round-timeout", "20s"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	path := filepath.Join(dir, coordinator.LedgerFile)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if rep, err := ledger.Audit(path); err == nil && rep.Applied >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run made no progress")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("interrupted run: %v", err)
	}
	if !strings.Contains(out.String(), "run the same command to resume") {
		t.Errorf("output %q lacks the resume hint", out.String())
	}
	if rep, err := ledger.Audit(path); err != nil || !rep.OK {
		t.Errorf("ledger after the interruption: %+v, %v", rep, err)
	}
}

// TestLocalDevice: `local --device cpu` trains on the device and names it
// in its startup log.
func TestLocalDevice(t *testing.T) {
	cmd := NewCoordinatorCmd()
	var out, logs bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&logs)
	cmd.SetArgs(localArgs(t.TempDir(), "--max-steps", "3", "--nodes", "2", "--device", "cpu", "--log-format", "json"))
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	var res localResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Steps != 3 {
		t.Fatalf("result %+v, %v\n%s", res, err, out.String())
	}
	want := fmt.Sprintf(`"msg":"compute device","device":"cpu","device_name":%q,"device_memory_bytes":0,"compute_capability":""`, cpuInfo(t).Name)
	if !strings.Contains(logs.String(), want) {
		t.Errorf("logs lack %s:\n%s", want, logs.String())
	}
}

// TestLocalFinishedRunSaysSo: `local` on the data dir of a finished run
// trains nothing and says that the run is finished and how to train more
// (a new run, with its own budget), instead of "trained … for N steps".
func TestLocalFinishedRunSaysSo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	args := []string{"local", "--dataset", "gaussian", "--model", "logreg", "--batch-size", "100", "--max-steps", "5",
		"--data-dir", dir, "--progress", "off"}
	out, _, err := runCmd(t, args...)
	if err != nil || !strings.Contains(out, "trained gaussian-logreg for 5 steps") {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"run gaussian-logreg is already finished: 5 steps (max steps reached); nothing was trained",
		"start a new run with its own budget in another --data-dir"} {
		if !strings.Contains(out, want) {
			t.Errorf("second run's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "trained gaussian-logreg") {
		t.Errorf("second run says it trained:\n%s", out)
	}
}

// TestLocalWithNamedNodes: a run that names its nodes (--node-ids, run
// file node_ids) trains with local's in-process nodes under those names,
// each on the shard the list gives it; a node command whose --id the list
// does not name, or whose shard flags contradict it, is refused before it
// loads anything.
func TestLocalWithNamedNodes(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runCmd(t, "local", "--dataset", "gaussian", "--model", "logreg", "--batch-size", "100", "--max-steps", "3",
		"--nodes", "2", "--node-ids", "site-a,site-b", "--data-dir", filepath.Join(dir, "d"), "--progress", "off")
	if err != nil || !strings.Contains(out, "for 3 steps") {
		t.Fatalf("local with named nodes: %v\n%s", err, out)
	}
	if _, _, err := runCmd(t, "local", "--dataset", "gaussian", "--nodes", "3", "--node-ids", "site-a,site-b",
		"--data-dir", filepath.Join(dir, "e")); err == nil || !strings.Contains(err.Error(), "the run names 2 nodes") {
		t.Errorf("local --nodes 3 with two named nodes: %v", err)
	}
	runFile := filepath.Join(dir, "run.yaml")
	writeFile(t, runFile, "run: named\ndataset: gaussian\nmodel: logreg\nnode_ids: [site-a, site-b]\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--id", "site-z"}, "--id site-z is not one of the run's nodes"},
		{[]string{"--id", "site-b", "--shard-index", "0", "--shard-count", "2"}, "gives site-b shard 1 of 2"},
	} {
		err := runNodeCmd(context.Background(), io.Discard, append([]string{"--config", runFile, "--nats", "nats://127.0.0.1:1"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("node %v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestLocalCSVWithHeader is issue 26's first finding: a CSV with a header
// failed with `label "..." is not a non-negative integer` and no way
// out. With --label-column it trains; without, the error says how to name
// the label column.
func TestLocalCSVWithHeader(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("height,weight,label\n")
	for i := range 400 {
		fmt.Fprintf(&b, "%d,%d,%d\n", i%7, i%5, i%2)
	}
	data := filepath.Join(dir, "people.csv")
	writeFile(t, data, b.String())
	_, _, err := runCmd(t, "local", "--data-path", data, "--max-steps", "3", "--batch-size", "40", "--data-dir", filepath.Join(dir, "a"), "--progress", "off")
	if err == nil || !strings.Contains(err.Error(), `people.csv:1: column 1: label "height" is not a non-negative integer`) || !strings.Contains(err.Error(), "--label-column NAME") {
		t.Errorf("a CSV with a header, no --label-column: %v, want the row's error and how to name the label column", err)
	}
	out, _, err := runCmd(t, "local", "--data-path", data, "--label-column", "label", "--max-steps", "3", "--batch-size", "40",
		"--data-dir", filepath.Join(dir, "b"), "--progress", "off")
	if err != nil || !strings.Contains(out, "trained people-mlp for 3 steps") {
		t.Errorf("with --label-column label: %v\n%s", err, out)
	}
}

// TestStepTrainedIgnoresEvaluations: `local` decides whether it trained
// from the OnStep reports; the final evaluation of a run that had finished
// before (the Server's finish reports Step = EvalStep = the last step) is
// not a step trained. It was counted, so a second `local` on a finished
// run's dir said "trained … for 5 steps" whenever its replica led before
// the loop saw the stopped state (CI stop 37, TestLocalFinishedRunSaysSo).
func TestStepTrainedIgnoresEvaluations(t *testing.T) {
	step := coordinator.Progress{Step: 5, MaxSteps: 5, Epsilon: 3}
	final := step
	final.Eval, final.EvalStep = coordinator.Evaluation{Loss: 2.4, Accuracy: 0.1, N: 2000}, 5
	if !stepTrained(step) {
		t.Error("a step's report was not counted as a step trained")
	}
	if stepTrained(final) {
		t.Error("the final evaluation's report was counted as a step trained")
	}
}

// TestLogAndBarShareStderr: the logger (written from the Raft, NATS and
// node goroutines) and the progress bar (the server's loop) write to one
// stderr; their writes are serialized. Before, each took only its own lock,
// a data race on any stderr that is not an *os.File (found by -race on the
// command's test buffer).
func TestLogAndBarShareStderr(t *testing.T) {
	cmd := NewCoordinatorCmd()
	var buf bytes.Buffer
	cmd.SetErr(&buf)
	log, err := newLogger(cmd, "text", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProgress(stderr(cmd), "on", log)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			log.Warn("from another goroutine", "i", i)
		}
	}()
	for i := range n {
		p.update(coordinator.Progress{Step: int64(i + 1), MaxSteps: n, EvalStep: int64(i + 1), EvalData: coordinator.EvalPublic})
	}
	<-done
	out := buf.String()
	if got := strings.Count(out, "msg=\"from another goroutine\""); got != n {
		t.Errorf("%d whole log records, want %d", got, n)
	}
	if got := strings.Count(out, "\r\x1b[K["); got != n {
		t.Errorf("%d whole bar draws, want %d", got, n)
	}
}

// TestRunFileListFlagsWin: list flags given beside --config replace the
// run file's lists, item for item, as every other flag wins over the
// file: re-applied item by item, never by their printed form ("[a,b]"),
// which a list flag would append as more items.
func TestRunFileListFlagsWin(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.csv")
	writeFile(t, data, "f1,f2,f3,y\n1,2,3,x\n4,5,6,y\n7,8,9,z\n")
	runFile := filepath.Join(dir, "run.yaml")
	writeFile(t, runFile, "data_path: "+data+"\nlabel_column: y\nnode_ids: [p, q, r]\nlabels: [z, y, x]\nfeature_columns: [f3]\ninput_shape: [1]\n")
	spec := defaultRunSpec()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	spec.bind(fs)
	if err := fs.Parse([]string{"--node-ids", "a,b", "--labels", "x,y,z", "--feature-columns", "f1,f2", "--input-shape", "2"}); err != nil {
		t.Fatal(err)
	}
	if err := loadRunSpec(&spec, runFile, fs); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ got, want any }{
		"node_ids":        {spec.Nodes, []string{"a", "b"}},
		"labels":          {spec.Labels, []string{"x", "y", "z"}},
		"feature_columns": {spec.FeatureColumns, []string{"f1", "f2"}},
		"input_shape":     {spec.InputShape, []int{2}},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: %q, want the flag's %q", name, tc.got, tc.want)
		}
	}
}

// TestLocalWeakEpsilonWarned: a target ε above 10 trains, with a warning
// that says what it means.
func TestLocalWeakEpsilonWarned(t *testing.T) {
	_, stderr, err := runCmd(t, localArgs(t.TempDir(), "--target-epsilon", "50", "--max-steps", "5")...)
	if err != nil || !strings.Contains(stderr, "target ε = 50 is above 10") {
		t.Errorf("--target-epsilon 50: %v, want a run with a warning\n%s", err, stderr)
	}
}

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
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/dataset"
)

// The CSV runs below train the 8-feature, 3-class logistic regression of
// writeSpec on csvTrainRows rows (the private training file F) and, with
// --eval-path, evaluate on csvEvalRows rows of a separate file E.
const (
	csvTrainRows = 600
	csvEvalRows  = 90
	csvBatch     = 60.0
)

// writeMixtureCSV writes n rows of an 8-dimensional, 3-class Gaussian
// mixture drawn with seed as a headerless CSV (label first) and returns
// its path.
func writeMixtureCSV(t *testing.T, dir, name string, n int, seed uint64) string {
	t.Helper()
	d, err := dataset.GaussianMixture(n, 8, 3, 4, seed)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range d.Len() {
		fmt.Fprintf(&b, "%d", d.Y[i])
		for _, v := range d.X[i*d.Dim : (i+1)*d.Dim] {
			fmt.Fprintf(&b, ",%g", v)
		}
		b.WriteByte('\n')
	}
	path := filepath.Join(dir, name)
	writeFile(t, path, b.String())
	return path
}

// runCmd runs the coordinator command with args and returns its stdout and
// stderr (the logs and progress bar).
func runCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := NewCoordinatorCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// csvLocalArgs is a short `coordinator local` run on the CSV file data.
func csvLocalArgs(t *testing.T, data, spec string, extra ...string) []string {
	return append([]string{"local", "--dataset", "csv", "--data-path", data, "--model-spec", spec,
		"--batch-size", fmt.Sprint(csvBatch), "--lr", "0.05", "--max-steps", "10", "--eval-every", "5", "--round-timeout", "20s",
		"--nodes", "2", "--data-dir", t.TempDir(), "--run", "t-csv", "--progress", "off"}, extra...)
}

// localJSON runs `coordinator local ... --json` and decodes its output as
// a generic object, so that the test sees exactly the keys it prints.
func localJSON(t *testing.T, args []string) map[string]any {
	t.Helper()
	out, logs, err := runCmd(t, append(args, "--json")...)
	if err != nil {
		t.Fatalf("local: %v\nlogs:\n%s", err, logs)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	return res
}

// TestLocalCSVDoesNotEvaluateOnTrainingRows is the regression test of
// issue 11 item 10: a CSV run given only its (private) training file trains
// on all of it (N = every row, so q = B/N with N = 600) and evaluates
// nothing, rather than carving 20% of the private rows out as a "test
// split" and releasing an un-noised accuracy on them as if it were private.
func TestLocalCSVDoesNotEvaluateOnTrainingRows(t *testing.T) {
	dir := t.TempDir()
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	res := localJSON(t, csvLocalArgs(t, data, spec))
	if got, want := res["sample_rate"], csvBatch/csvTrainRows; got != want {
		t.Errorf("sample rate %v, want B/N = %v: the training set must be every row of the file", got, want)
	}
	if res["charged_step"] != res["steps"] || res["steps"] != 10.0 {
		t.Errorf("charged_step %v, steps %v: want ε through the 10th step, the last applied", res["charged_step"], res["steps"])
	}
	for _, key := range []string{"test_accuracy", "test_loss", "nonprivate_holdout_accuracy"} {
		if v, ok := res[key]; ok {
			t.Errorf("%s = %v: a csv run without --eval-path evaluated on something", key, v)
		}
	}
	if got := res["eval_data"]; got != "none" {
		t.Errorf("eval_data %v, want none", got)
	}

	// The human-readable summary says why there is no accuracy.
	out, _, err := runCmd(t, csvLocalArgs(t, data, spec)...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "accuracy") || !strings.Contains(out, "--eval-path") {
		t.Errorf("summary %q: want no accuracy and a pointer to --eval-path", out)
	}
}

// TestLocalCSVEvalPath: with --eval-path E the run trains on every row of
// the training file and evaluates on the rows of E only (their count is
// reported), labelled as a private (public-data) test evaluation.
func TestLocalCSVEvalPath(t *testing.T) {
	dir := t.TempDir()
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	eval := writeMixtureCSV(t, dir, "eval.csv", csvEvalRows, 12)
	// ε = 50: little noise, so 10 steps reliably beat chance (at the default
	// ε = 3 the fresh noise left the model at chance in about 1 run in 20).
	res := localJSON(t, csvLocalArgs(t, data, spec, "--eval-path", eval, "--target-epsilon", "50"))
	if got, want := res["sample_rate"], csvBatch/csvTrainRows; got != want {
		t.Errorf("sample rate %v, want B/N = %v", got, want)
	}
	if got := res["test_examples"]; got != float64(csvEvalRows) {
		t.Errorf("evaluated on %v examples, want the %d rows of the --eval-path file", got, csvEvalRows)
	}
	if acc, ok := res["test_accuracy"].(float64); !ok || !(acc > 1.0/3) {
		t.Errorf("test_accuracy %v: missing or no better than chance", res["test_accuracy"])
	}
	if _, ok := res["nonprivate_holdout_accuracy"]; ok || res["eval_data"] != "test" {
		t.Errorf("a public evaluation set is labelled %v / %v", res["eval_data"], res["nonprivate_holdout_accuracy"])
	}
}

// TestLocalCSVHoldoutIsLabelledNonPrivate: --eval-split-from-train carves a
// held-out split from the training file (N = the rest, so q = B/480), and
// its accuracy is labelled NON-PRIVATE in every output of local: the JSON
// keys, the summary line, the structured evaluation logs and the progress
// bar. It never appears under a "test" name.
func TestLocalCSVHoldoutIsLabelledNonPrivate(t *testing.T) {
	dir := t.TempDir()
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	const heldOut = 120 // round(0.2·600)

	res := localJSON(t, csvLocalArgs(t, data, spec, "--eval-split-from-train", "0.2"))
	if got, want := res["sample_rate"], csvBatch/(csvTrainRows-heldOut); got != want {
		t.Errorf("sample rate %v, want B/N = %v with the held-out rows removed from N", got, want)
	}
	if _, ok := res["nonprivate_holdout_accuracy"].(float64); !ok {
		t.Errorf("no nonprivate_holdout_accuracy in %v", res)
	}
	if got := res["nonprivate_holdout_examples"]; got != float64(heldOut) {
		t.Errorf("nonprivate_holdout_examples %v, want %d", got, heldOut)
	}
	for _, key := range []string{"test_accuracy", "test_loss", "test_examples"} {
		if v, ok := res[key]; ok {
			t.Errorf("%s = %v: a holdout of the private file reported under a test name", key, v)
		}
	}
	if got, _ := res["eval_data"].(string); !strings.Contains(got, "NON-PRIVATE") {
		t.Errorf("eval_data %q is not labelled NON-PRIVATE", got)
	}

	// Text output with structured logs: every line that carries the
	// evaluation says NON-PRIVATE, and none calls it a test evaluation.
	out, logs, err := runCmd(t, csvLocalArgs(t, data, spec, "--eval-split-from-train", "0.2", "--log-format", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "NON-PRIVATE") || strings.Contains(out, "test accuracy") {
		t.Errorf("summary %q: the holdout accuracy is not labelled NON-PRIVATE", out)
	}
	evalLogs := 0
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"accuracy"`) {
			continue
		}
		evalLogs++
		if !strings.Contains(line, "NON-PRIVATE") || !strings.Contains(line, `"private":false`) {
			t.Errorf("evaluation log line not labelled NON-PRIVATE: %s", line)
		}
	}
	if evalLogs == 0 {
		t.Errorf("no evaluation was logged:\n%s", logs)
	}

	// The progress bar.
	_, bar, err := runCmd(t, csvLocalArgs(t, data, spec, "--eval-split-from-train", "0.2", "--progress", "on")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(bar, "NON-PRIVATE holdout acc") || strings.Contains(bar, "test acc") {
		t.Errorf("progress bar %q: the holdout accuracy is not labelled NON-PRIVATE", bar)
	}
}

// TestLoadShardPartitionsTheCoordinatorsTrainingSet: the node's loader and
// the coordinator's derive the same training set, so the nodes' shards add
// up to the N the coordinator puts in q = B/N, whichever evaluation choice
// the run makes.
func TestNodeShardsPartitionTheCoordinatorsTrainingSet(t *testing.T) {
	dir := t.TempDir()
	specPath, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	eval := writeMixtureCSV(t, dir, "eval.csv", csvEvalRows, 12)
	for _, tc := range []struct {
		name  string
		flags []string
		wantN int
	}{
		{"no evaluation", nil, csvTrainRows},
		{"eval path", []string{"--eval-path", eval}, csvTrainRows},
		{"holdout", []string{"--eval-split-from-train", "0.2"}, csvTrainRows - 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The coordinator's N.
			res := localJSON(t, append(csvLocalArgs(t, data, specPath, tc.flags...), "--max-steps", "1"))
			n := csvBatch / res["sample_rate"].(float64)
			if int(n+0.5) != tc.wantN {
				t.Errorf("coordinator N = %v, want %d", n, tc.wantN)
			}
			// The nodes' shards, loaded as the node command loads them.
			const count = 3
			total := 0
			for i := range count {
				_, shard, err := loadNodeShard(t.Context(), nodeSpec(t, specPath, data, tc.flags), i, count, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatal(err)
				}
				total += shard.Len()
			}
			if total != tc.wantN {
				t.Errorf("node shards hold %d rows, coordinator N = %d", total, tc.wantN)
			}
		})
	}
}

// nodeSpec parses the run flags (the data flags plus extra, the
// coordinator's own) with the binding the node command uses, into its run
// spec, without running the node.
func nodeSpec(t *testing.T, specPath, data string, extra []string) runSpec {
	t.Helper()
	spec := defaultRunSpec()
	fs := pflag.NewFlagSet("node", pflag.ContinueOnError)
	spec.bind(fs)
	args := append([]string{"--model-spec", specPath, "--dataset", "csv", "--data-path", data,
		"--batch-size", fmt.Sprint(csvBatch)}, extra...)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return spec
}

// TestLocalCSVEvalPathOverlappingTrainingRowsRefused: evaluation data is
// compared with the training data by content, row by row (features and
// label as read), not by path. A copy of the training file under another
// name, with its numbers written differently, is refused; so is a file
// that mixes a few training rows into otherwise separate rows, and the
// error says how many of its rows are training rows. An accuracy printed
// as held-out is then always on rows the model was not trained on.
func TestLocalCSVEvalPathOverlappingTrainingRowsRefused(t *testing.T) {
	dir := t.TempDir()
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	train, err := dataset.ReadFile(data, dataset.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := dataset.GaussianMixture(csvEvalRows, 8, 3, 4, 12)
	if err != nil {
		t.Fatal(err)
	}
	// writeRows writes rows of d as a headerless CSV, each number with 12
	// significant digits (train.csv has the shortest form), so that no
	// line is byte-equal to a line of train.csv.
	writeRows := func(name string, d *dataset.Dataset, rows []int) string {
		var b strings.Builder
		for _, i := range rows {
			fmt.Fprintf(&b, "%d", d.Y[i])
			for _, v := range d.Row(i) {
				fmt.Fprintf(&b, ",%.12g", float64(v))
			}
			b.WriteByte('\n')
		}
		path := filepath.Join(dir, name)
		writeFile(t, path, b.String())
		return path
	}
	all := make([]int, csvTrainRows)
	for i := range all {
		all[i] = i
	}
	copyOfTrain := writeRows("copy.csv", train, all)
	// csvEvalRows separate rows with 7 training rows after them.
	var mixed strings.Builder
	for i := range csvEvalRows {
		fmt.Fprintf(&mixed, "%d", other.Y[i])
		for _, v := range other.Row(i) {
			fmt.Fprintf(&mixed, ",%g", v)
		}
		mixed.WriteByte('\n')
	}
	part, err := os.ReadFile(writeRows("part.csv", train, []int{3, 50, 99, 200, 201, 402, 599}))
	if err != nil {
		t.Fatal(err)
	}
	mixed.Write(part)
	partial := filepath.Join(dir, "partial.csv")
	writeFile(t, partial, mixed.String())

	for _, tc := range []struct {
		name, eval, want string
	}{
		{"a copy of the training file", copyOfTrain, fmt.Sprintf("all %d of its %d rows are rows of the training file", csvTrainRows, csvTrainRows)},
		{"a few training rows mixed in", partial, fmt.Sprintf("7 of its %d rows are rows of the training file", csvEvalRows+7)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runCmd(t, csvLocalArgs(t, data, spec, "--eval-path", tc.eval)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q\nout: %s", err, tc.want, out)
			}
			if strings.Contains(out, "accuracy") {
				t.Errorf("an accuracy was printed: %s", out)
			}
		})
	}
}

func TestEvalDataFlagErrors(t *testing.T) {
	dir := t.TempDir()
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	eval := writeMixtureCSV(t, dir, "eval.csv", csvEvalRows, 12)
	wide := filepath.Join(dir, "wide.csv")
	writeFile(t, wide, "0,1,2,3\n1,4,5,6\n")
	link := filepath.Join(dir, "same.csv")
	if err := os.Symlink(data, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"both", []string{"--eval-path", eval, "--eval-split-from-train", "0.2"}, "not both"},
		{"negative fraction", []string{"--eval-split-from-train", "-0.1"}, "eval_split_from_train"},
		{"fraction 1", []string{"--eval-split-from-train", "1"}, "eval_split_from_train"},
		{"fraction NaN", []string{"--eval-split-from-train", "NaN"}, "eval_split_from_train"},
		{"eval path is the training file", []string{"--eval-path", data}, "training file"},
		{"eval path links to the training file", []string{"--eval-path", link}, "training file"},
		{"missing eval file", []string{"--eval-path", filepath.Join(dir, "nope.csv")}, "--eval-path"},
		{"eval file does not fit the model", []string{"--eval-path", wide}, "--eval-path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runCmd(t, csvLocalArgs(t, data, spec, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	// The eval flags are for data files (csv) only: Fashion-MNIST has its public t10k
	// files and the gaussian data is public and synthetic.
	for _, args := range [][]string{
		{"--dataset", "gaussian", "--eval-path", eval},
		{"--dataset", "gaussian", "--eval-split-from-train", "0.2"},
		{"--dataset", "fashion-mnist", "--eval-path", eval},
	} {
		_, _, err := runCmd(t, append([]string{"local", "--model", "logreg", "--data-dir", t.TempDir()}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "for dataset file") {
			t.Errorf("%v: err = %v, want one saying the option is for dataset file", args, err)
		}
	}
}

// TestServeCSVHoldoutIsLabelledNonPrivate runs `coordinator serve` with a
// `node` command on a CSV file with --eval-split-from-train: the node
// shards the same training set the coordinator counts as N (its join
// reports all 480 training rows), and serve's summary line and evaluation
// logs label the accuracy NON-PRIVATE.
func TestServeCSVHoldoutIsLabelledNonPrivate(t *testing.T) {
	dir := t.TempDir()
	spec, _ := writeSpec(t)
	data := writeMixtureCSV(t, dir, "train.csv", csvTrainRows, 11)
	srv := startTestNATS(t)
	const runName = "t-serve-csv"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One run file for the replica and the node, as in a deployment.
	runFile := writeRunFile(t, "run: "+runName, "dataset: csv", "data_path: "+data, "model_spec: "+spec,
		"eval_split_from_train: 0.2", "batch_size: 60", "lr: 0.05", "max_steps: 10", "eval_every: 5", "round_timeout: 20s")

	nodeDone := make(chan error, 1)
	go func() {
		nodeDone <- runNodeCmd(ctx, io.Discard, "--nats", srv.URL(), "--id", "n0", "--config", runFile)
	}()
	out, logs, err := runCmd(t, "serve", "--nats", srv.URL(), "--id", "r1", "--raft-addr", freeAddrString(t),
		"--data-dir", filepath.Join(dir, "r1"), "--bootstrap", "--config", runFile, "--log-format", "json")
	if err != nil {
		t.Fatalf("serve: %v\nlogs:\n%s", err, logs)
	}
	if err := <-nodeDone; err != nil {
		t.Errorf("node: %v", err)
	}
	if !strings.Contains(out, "NON-PRIVATE holdout accuracy") || !strings.Contains(out, "on 120 examples held out") ||
		strings.Contains(out, "test accuracy") {
		t.Errorf("serve summary %q: the holdout accuracy is not labelled NON-PRIVATE", out)
	}
	if !strings.Contains(logs, `"msg":"node joined","node":"n0","shard":480`) {
		t.Errorf("the node did not join with the 480 training rows the coordinator counts:\n%s", logs)
	}
	evalLogs := 0
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"accuracy"`) {
			evalLogs++
			if !strings.Contains(line, "NON-PRIVATE holdout evaluation") {
				t.Errorf("evaluation log line not labelled NON-PRIVATE: %s", line)
			}
		}
	}
	if evalLogs == 0 {
		t.Errorf("no evaluation logged:\n%s", logs)
	}
}

// TestLocalFortunesCategory trains the textbag preset on the
// fortunes-category dataset of a fortune directory (two categories whose
// fortunes use different words): the model is shaped by the data (its
// classes, named by the files), evaluated on the held-out documents, and
// learns the task.
func TestLocalFortunesCategory(t *testing.T) {
	dir := t.TempDir()
	for name, words := range map[string]string{"science": "atom energy quark photon", "food": "bread cheese apple soup"} {
		var b strings.Builder
		for i := range 200 {
			w := strings.Fields(words)
			fmt.Fprintf(&b, "%s and %s, %d\n%%\n", w[i%4], w[(i+1)%4], i)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res := localJSON(t, []string{"local", "--dataset", "fortunes-category", "--data", dir, "--model", "textbag", "--seq-len", "8", "--vocab", "1024",
		"--batch-size", "40", "--max-steps", "60", "--target-epsilon", "8", "--eval-every", "0", "--lr", "0.05", "--round-timeout", "20s",
		"--data-dir", t.TempDir(), "--progress", "off", "--json"})
	if res["eval_data"] != "test" || res["test_examples"] != float64(40) {
		t.Fatalf("evaluation %v on %v examples, want the 40 held-out documents", res["eval_data"], res["test_examples"])
	}
	if acc, _ := res["test_accuracy"].(float64); acc < 0.75 {
		t.Errorf("test accuracy %v: the two categories' words tell them apart (chance is 0.5)", acc)
	}
	if res["run"] != "fortunes-category-textbag" {
		t.Errorf("run %v", res["run"])
	}
}

// TestLocalCSVTextColumn trains the textbag preset on a CSV file's text
// column (--text-column), evaluated on a separate file read the same
// way; a text column that does not exist is a one-line error before
// anything trains.
func TestLocalCSVTextColumn(t *testing.T) {
	skipUnderRace(t)
	dir := t.TempDir()
	// Training rows hold three of a topic's words, evaluation rows all
	// four: no evaluation row is a training row.
	write := func(name string, from, n, k int) string {
		var b strings.Builder
		b.WriteString("id,topic,text\n")
		words := map[string][]string{"science": {"atom", "energy", "quark", "photon"}, "food": {"bread", "cheese", "apple", "soup"}}
		for i := from; i < from+n; i++ {
			topic := []string{"science", "food"}[i%2]
			var text []string
			for j := range k {
				text = append(text, words[topic][(i+j)%4])
			}
			fmt.Fprintf(&b, "%d,%s,\"%s\"\n", i, topic, strings.Join(text, ", "))
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	train, test := write("train.csv", 0, 400, 3), write("test.csv", 1000, 60, 4)
	// The learning rate is small: with a large one (0.05) the noise can
	// drive all of textbag's hidden ReLUs dead, one class for every row.
	args := func(extra ...string) []string {
		return append([]string{"local", "--data-path", train, "--eval-path", test, "--label-column", "topic", "--model", "textbag",
			"--seq-len", "8", "--batch-size", "40", "--max-steps", "60", "--target-epsilon", "8", "--eval-every", "0", "--lr", "0.005", "--round-timeout", "20s",
			"--data-dir", t.TempDir(), "--progress", "off", "--json"}, extra...)
	}
	res := localJSON(t, args("--text-column", "text", "--vocab", "1024"))
	if res["eval_data"] != "test" || res["test_examples"] != float64(60) {
		t.Fatalf("evaluation %v on %v examples, want the 60 rows of the test file", res["eval_data"], res["test_examples"])
	}
	if acc, _ := res["test_accuracy"].(float64); acc < 0.75 {
		t.Errorf("test accuracy %v: the two topics' words tell them apart (chance is 0.5)", acc)
	}
	// The same with a checkpoint's WordPiece vocabulary: the model is
	// shaped by its size.
	ckpt := filepath.Join(dir, "ckpt")
	if err := os.MkdirAll(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	vocab := "[PAD]\n[UNK]\n[CLS]\n[SEP]\n,\natom\nenergy\nquark\nphoton\nbread\ncheese\napple\nsoup\n"
	if err := os.WriteFile(filepath.Join(ckpt, "vocab.txt"), []byte(vocab), 0o644); err != nil {
		t.Fatal(err)
	}
	res = localJSON(t, args("--text-column", "text", "--tokenizer", ckpt))
	if acc, _ := res["test_accuracy"].(float64); acc < 0.6 {
		t.Errorf("with the checkpoint's tokenizer: test accuracy %v, chance is 0.5", acc)
	}
	_, _, err := runCmd(t, args("--text-column", "body")...)
	if err == nil || !strings.Contains(err.Error(), `no column "body"`) || strings.Contains(err.Error(), "\n") {
		t.Errorf("a text column that does not exist: %v, want a one-line error naming it", err)
	}
}

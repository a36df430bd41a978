//go:build unix

package e2e

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"codeberg.org/sbinet/npyio"
	"github.com/parquet-go/parquet-go"
	"gonum.org/v1/gonum/mat"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
)

// localRow is one row of the Parquet file a node of TestProcessNodeLocalData
// holds.
type localRow struct {
	F0    float64 `parquet:"f0"`
	F1    float64 `parquet:"f1"`
	F2    float64 `parquet:"f2"`
	F3    float64 `parquet:"f3"`
	F4    float64 `parquet:"f4"`
	F5    float64 `parquet:"f5"`
	F6    float64 `parquet:"f6"`
	F7    float64 `parquet:"f7"`
	Label int64   `parquet:"label"`
}

// TestProcessNodeLocalData is issue 26's end-to-end test of node-local
// data: one `coordinator serve` that loads no training data and three
// nodes, each its own OS process holding its own file in its own format
// and size — a CSV with a header and a named label column (300 rows), an
// NPY array (500) and a Parquet file (700) — train through the real path
// to max_steps, and the ledger audits clean. Two more nodes are refused
// with a clear error: one whose data has the wrong shape (refused by
// itself before it joins, naming the file, its shape and the run's), and
// one whose run file names another label set (refused by the leader at
// join: data_schema, naming both schemas). The run's N is declared in the
// run file; the leader learns each node's count at join.
func TestProcessNodeLocalData(t *testing.T) {
	const (
		run      = "e2e-local-data"
		maxSteps = 25
		features = 8
		classes  = 3
	)
	h := New(t)
	dir := h.Dir("data")
	all, err := dataset.GaussianMixture(1500+40, features, classes, 3, 11)
	if err != nil {
		t.Fatal(err)
	}
	part := func(from, to int) *dataset.Dataset {
		idx := make([]int, to-from)
		for i := range idx {
			idx[i] = from + i
		}
		return all.Subset(idx)
	}
	csvFile := writeLocalCSV(t, filepath.Join(dir, "site-a.csv"), part(0, 300), []string{"0", "1", "2"})
	npyFile := writeLocalNPY(t, filepath.Join(dir, "site-b.npy"), part(300, 800))
	parquetFile := writeLocalParquet(t, filepath.Join(dir, "site-c.parquet"), part(800, 1500))
	// Wrong shape: five features where the run has eight.
	narrow := part(1500, 1520)
	narrow.Dim, narrow.Shape = 5, nil
	narrow.X = narrow.X[:20*5]
	narrowFile := writeLocalCSV(t, filepath.Join(dir, "narrow.csv"), narrow, []string{"0", "1", "2"})
	// Another label set: the classes named, in a run of integer classes.
	namedFile := writeLocalCSV(t, filepath.Join(dir, "named.csv"), part(1520, 1540), []string{"a", "b", "c"})

	runDir := h.Dir("run")
	common := fmt.Sprintf("run: %s\ndataset: local\nlabel_column: label\ninput_shape: [%d]\n"+
		"total_examples: 1500\nbatch_size: 60\nmodel: mlp\nmax_steps: %d\nround_timeout: 3s\nmin_nodes: 3\neval_every: 0\n",
		run, features, maxSteps)
	runFile := filepath.Join(runDir, "run.yaml")
	writeFile(t, runFile, common+fmt.Sprintf("classes: %d\n", classes))
	namedRunFile := filepath.Join(runDir, "run-named.yaml")
	writeFile(t, namedRunFile, common+"labels: [a, b, c]\n")

	_, natsURL := h.StartNATS("nats")
	dataDir := h.Dir("r1")
	metricsAddr := FreeAddr(t)
	serve := h.Start("serve", h.Bin.Coordinator, "serve", "--id", "r1", "--raft-addr", FreeAddr(t), "--data-dir", dataDir,
		"--bootstrap", "--nats", natsURL, "--metrics-addr", metricsAddr, "--config", runFile, "--insecure-seed", "7")
	nodeArgs := func(i int, file, data string) []string {
		return []string{"--config", file, "--nats", natsURL, "--id", nodeID(i), "--data-path", data,
			"--insecure-seed", strconv.Itoa(101 + i)}
	}
	var nodes []*Proc
	for i, data := range []string{csvFile, npyFile, parquetFile} {
		nodes = append(nodes, h.Start("node-"+strconv.Itoa(i), h.Bin.Node, nodeArgs(i, runFile, data)...))
	}

	// The node whose data has the wrong shape stops before it joins.
	bad := h.Start("node-narrow", h.Bin.Node, nodeArgs(3, runFile, narrowFile)...)
	if ps := bad.Wait(60 * time.Second); ps.ExitCode() == 0 {
		h.Fatalf("node-narrow: %v, want a non-zero exit", ps)
	}
	for _, want := range []string{narrowFile, "input shape [5]", "the run's is [8]"} {
		if !strings.Contains(bad.Logs(), want) {
			h.Fatalf("node-narrow's error lacks %q:\n%s", want, tail(bad.LogPath(), 5))
		}
	}
	// The node with another label set is refused by the leader at join.
	named := h.Start("node-named", h.Bin.Node, nodeArgs(4, namedRunFile, namedFile)...)
	if ps := named.Wait(90 * time.Second); ps.ExitCode() == 0 {
		h.Fatalf("node-named: %v, want a non-zero exit", ps)
	}
	for _, want := range []string{"refuses this node", `3 classes ["a" "b" "c"]`, "the run's data has shape [8], 3 classes, label set"} {
		if !strings.Contains(named.Logs(), want) {
			h.Fatalf("node-named's error lacks %q:\n%s", want, tail(named.LogPath(), 5))
		}
	}

	// The three good nodes train to the end.
	if ps := serve.Wait(3 * time.Minute); ps.ExitCode() != 0 {
		h.Fatalf("serve: %v, want exit 0", ps)
	}
	logs := serve.Logs()
	if want := fmt.Sprintf("run %s finished after %d steps (max steps reached)", run, maxSteps); !strings.Contains(logs, want) {
		h.Fatalf("serve's output lacks %q", want)
	}
	for i, n := range []int{300, 500, 700} {
		want := fmt.Sprintf(`msg="node joined with its own data" node=%s examples=%d`, nodeID(i), n)
		if !strings.Contains(logs, want) {
			h.Fatalf("serve's log lacks %q", want)
		}
	}
	if !strings.Contains(logs, "reason=data_schema") {
		h.Fatalf("serve's log does not say it refused node-named for its data schema")
	}
	for _, n := range nodes {
		if ps := n.Wait(30 * time.Second); ps.ExitCode() != 0 {
			h.Fatalf("%s: %v, want exit 0 after the run", n.Name(), ps)
		}
		last, _ := logField(n.Logs(), `msg="node: stop"`, "last_step")
		if s, err := strconv.Atoi(last); err != nil || s < maxSteps/2 {
			h.Fatalf("%s: last step %q: it did not train through the run", n.Name(), last)
		}
	}
	rep, code, out := h.Audit(dataDir, maxSteps)
	if code != 0 || !rep.OK || rep.Applied != maxSteps || rep.Run != run {
		h.Fatalf("ledger audit: exit %d, ok %v, %d applied, run %q\n%s", code, rep.OK, rep.Applied, rep.Run, out)
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeLocalCSV writes d as a CSV with a header (f0, f1, …, label) whose
// labels are names[y].
func writeLocalCSV(t *testing.T, path string, d *dataset.Dataset, names []string) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := csv.NewWriter(f)
	head := make([]string, d.Dim+1)
	for j := range d.Dim {
		head[j] = "f" + strconv.Itoa(j)
	}
	head[d.Dim] = "label"
	w.Write(head)
	for i := range d.Len() {
		rec := make([]string, 0, d.Dim+1)
		for _, v := range d.Row(i) {
			rec = append(rec, strconv.FormatFloat(float64(v), 'g', -1, 32))
		}
		w.Write(append(rec, names[d.Y[i]]))
	}
	w.Flush()
	if err := w.Error(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeLocalNPY writes d as one (N, 1+Dim) float64 array, the label in
// column 0.
func writeLocalNPY(t *testing.T, path string, d *dataset.Dataset) string {
	t.Helper()
	m := mat.NewDense(d.Len(), d.Dim+1, nil)
	for i := range d.Len() {
		m.Set(i, 0, float64(d.Y[i]))
		for j, v := range d.Row(i) {
			m.Set(i, j+1, float64(v))
		}
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := npyio.Write(f, m); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeLocalParquet writes d (eight features) as a Parquet file with
// columns f0..f7 and label.
func writeLocalParquet(t *testing.T, path string, d *dataset.Dataset) string {
	t.Helper()
	rows := make([]localRow, d.Len())
	for i := range rows {
		x := d.Row(i)
		rows[i] = localRow{float64(x[0]), float64(x[1]), float64(x[2]), float64(x[3]),
			float64(x[4]), float64(x[5]), float64(x[6]), float64(x[7]), int64(d.Y[i])}
	}
	if err := parquet.WriteFile(path, rows); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestProcessNodesOnTokenShards is issue 30's multi-process run on a
// tokenized corpus: dataset.WriteSequenceCorpus deals the training
// documents to two shard files, and two node processes, each holding only
// its own `.tokens` file (dataset: local), train a small byte-level
// transformer through one `coordinator serve` that loads no training
// data, to the run's last step; the ledger audits clean.
func TestProcessNodesOnTokenShards(t *testing.T) {
	h := New(t)
	dir := t.TempDir()
	docs := make([][]byte, 60)
	for i := range docs {
		docs[i] = fmt.Appendf(nil, "Fortune %d: a journey of %d miles begins with a single step.", i, 10+i)
	}
	c := dataset.DefaultSequenceConfig()
	c.Context = 16
	sf, err := dataset.WriteSequenceCorpus(dir, "toy", docs, c, 2)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := json.Marshal(model.TransformerLM(dataset.ByteVocab, c.Context, 16, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(dir, "lm.json")
	writeFile(t, specFile, string(spec))
	const run, maxSteps = "e2e-tokens", 8
	runFile := filepath.Join(h.Dir("run"), "run.yaml")
	writeFile(t, runFile, fmt.Sprintf("run: %s\ndataset: local\ninput_shape: [%d]\nclasses: %d\nvocab: %d\n"+
		"total_examples: %d\nbatch_size: 16\nmodel_spec: %s\nmax_steps: %d\nround_timeout: 3s\nmin_nodes: 2\neval_every: 0\n",
		run, c.Context+1, dataset.ByteVocab, dataset.ByteVocab, sf.TrainRows, specFile, maxSteps))

	_, natsURL := h.StartNATS("nats")
	dataDir := h.Dir("r1")
	serve := h.Start("serve", h.Bin.Coordinator, "serve", "--id", "r1", "--raft-addr", FreeAddr(t), "--data-dir", dataDir,
		"--bootstrap", "--nats", natsURL, "--metrics-addr", FreeAddr(t), "--config", runFile, "--insecure-seed", "7")
	var nodes []*Proc
	for i, shard := range sf.TrainShards {
		nodes = append(nodes, h.Start("node-"+strconv.Itoa(i), h.Bin.Node, "--config", runFile, "--nats", natsURL,
			"--id", nodeID(i), "--data-path", shard, "--insecure-seed", strconv.Itoa(101+i)))
	}
	if ps := serve.Wait(3 * time.Minute); ps.ExitCode() != 0 {
		h.Fatalf("serve: %v, want exit 0", ps)
	}
	logs := serve.Logs()
	if want := fmt.Sprintf("run %s finished after %d steps (max steps reached)", run, maxSteps); !strings.Contains(logs, want) {
		h.Fatalf("serve's output lacks %q", want)
	}
	for i, n := range sf.ShardRows {
		want := fmt.Sprintf(`msg="node joined with its own data" node=%s examples=%d`, nodeID(i), n)
		if !strings.Contains(logs, want) {
			h.Fatalf("serve's log lacks %q", want)
		}
	}
	for _, n := range nodes {
		if ps := n.Wait(30 * time.Second); ps.ExitCode() != 0 {
			h.Fatalf("%s: %v, want exit 0 after the run", n.Name(), ps)
		}
	}
	rep, code, out := h.Audit(dataDir, maxSteps)
	if code != 0 || !rep.OK || rep.Applied != maxSteps || rep.Run != run {
		h.Fatalf("ledger audit: exit %d, ok %v, %d applied, run %q\n%s", code, rep.OK, rep.Applied, rep.Run, out)
	}
}

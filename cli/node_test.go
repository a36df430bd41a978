package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/node"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

const nodeTestWait = 20 * time.Second

// lockedBuffer is a bytes.Buffer safe for the command's logger and the
// test to use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runNodeCmd executes the node command with args under ctx; stderr (the
// logs) goes to logs.
func runNodeCmd(ctx context.Context, logs io.Writer, args ...string) error {
	cmd := NewNodeCmd()
	cmd.SetOut(io.Discard)
	cmd.SetErr(logs)
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// writeSpec writes a small logistic regression spec (8 features, 3
// classes) and returns its path and model.
func writeSpec(t *testing.T) (string, *model.Model) {
	t.Helper()
	spec := model.LogReg([]int{8}, 3)
	data, err := spec.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	return path, m
}

// writeRunFile writes a run file: a gaussian logistic regression run with
// B = 100 (N = 10000, so q = 0.01), C = 1 and 100 steps, with the given
// "key: value" lines replacing or adding keys.
func writeRunFile(t *testing.T, lines ...string) string {
	t.Helper()
	keys := []string{"run", "model", "dataset", "batch_size", "clip", "max_steps"}
	vals := map[string]string{"run": "cli-node", "model": "logreg", "dataset": "gaussian", "batch_size": "100",
		"clip": "1", "max_steps": "100"}
	for _, l := range lines {
		k, v, ok := strings.Cut(l, ": ")
		if !ok {
			t.Fatalf("run file line %q is not key: value", l)
		}
		if k == "model_spec" { // a spec replaces the preset: a file may not name both
			keys = slices.DeleteFunc(keys, func(k string) bool { return k == "model" })
			delete(vals, "model")
		}
		if _, seen := vals[k]; !seen {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s\n", k, vals[k])
	}
	path := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestNodeFlagErrors(t *testing.T) {
	spec, _ := writeSpec(t)
	csv := filepath.Join(t.TempDir(), "d.csv")
	if err := os.WriteFile(csv, []byte(strings.Repeat("0,1,2\n1,3,4\n", 5)), 0o600); err != nil {
		t.Fatal(err)
	}
	runFile := writeRunFile(t)
	// Port 1 is never a NATS server: every case must fail before dialing.
	nats := []string{"--nats", "nats://127.0.0.1:1"}
	with := func(args ...string) []string {
		return append([]string{"--nats", "nats://127.0.0.1:1", "--config", runFile}, args...)
	}
	type flagCase struct {
		name string
		args []string
		want string
	}
	cases := []flagCase{
		{"missing --nats", []string{"--config", runFile}, "--nats is required"},
		{"empty --nats", []string{"--nats", " , ", "--config", runFile}, "--nats is required"},
		{"missing --config", append(nats, "--dataset", "gaussian", "--model", "logreg"), "--config is required"},
		{"missing run file", append(nats, "--config", "/nonexistent/run.yaml"), "run file"},
		{"unknown key in the run file", append(nats, "--config", writeRunFile(t, "sample_rate: 1")), "sample_rate"},
		{"shard index out of range", with("--shard-index", "3", "--shard-count", "2"), "--shard-index 3 out of range"},
		{"negative shard index", with("--shard-index", "-1", "--shard-count", "2"), "--shard-index -1 out of range"},
		{"shard count 0", with("--shard-count", "0"), "--shard-count 0"},
		{"unknown preset", with("--model", "resnet"), `unknown preset "resnet"`},
		{"missing spec file", with("--model-spec", "/nonexistent/spec.json"), "--model-spec"},
		{"unknown dataset", with("--dataset", "imagenet"), `--dataset "imagenet": must be one of`},
		{"no dataset", with("--dataset", "none"), "dataset none is for coordinator serve"},
		{"csv without path", with("--dataset", "csv"), "--dataset csv needs --data-path FILE"},
		{"gaussian with a path", with("--data-path", csv), "neither"},
		{"csv that does not fit the model", with("--dataset", "csv", "--data-path", csv, "--model-spec", spec), "takes input shape [8] and 3 classes; the data has shape [2] and 2 classes"},
		{"batch larger than N", with("--batch-size", "20000"), "batch_size 20000 must be in (0, N = 10000]"},
		{"clip too large to bound", with("--clip", "1e25"), "--clip 1e+25: must be in"},
		{"clip too small to bound", with("--clip", "1e-30"), "--clip 1e-30: must be in"},
		{"bad id", with("--id", "a b"), "--id"},
		{"id with a dot", with("--id", "host.example.org-1"), "--id"},
		{"bad run", with("--run", "a.b"), "--run"},
		{"bad log format", with("--log-format", "xml"), "--log-format"},
		{"bad heartbeat", with("--heartbeat", "0s"), "--heartbeat"},
		{"stray argument", with("extra"), "unknown command"},
		{"unknown device", with("--device", "tpu:0"), `unknown device "tpu:0" (want cpu or cuda:N)`},
		{"bad CUDA device number", with("--device", "cuda:x"), "want cuda:N with N a device number"},
	}
	if !model.CUDAAvailable() {
		// model.OpenDevice's own message: how to get a binary that can.
		cases = append(cases, flagCase{"CUDA in a build without it", with("--device", "cuda:0"),
			`--device cuda:0: model: device not available: "cuda:0": this binary was built without CUDA support (build it with -tags cuda; see docs/GPU.md)`})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), nodeTestWait)
			defer cancel()
			err := runNodeCmd(ctx, io.Discard, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// leaderHarness plays the coordinator's leader over an embedded NATS
// server.
type leaderHarness struct {
	t        *testing.T
	conn     *transport.Client
	joins    chan transport.Join
	leaves   chan transport.Leave
	contribs chan transport.Contribution
}

func newLeaderHarness(t *testing.T, run string) *leaderHarness {
	t.Helper()
	cfg := transport.DefaultConfig()
	cfg.Run = run
	cfg.Embedded.Port = -1
	conn, err := transport.Connect(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	h := &leaderHarness{t: t, conn: conn, joins: make(chan transport.Join, 16),
		leaves: make(chan transport.Leave, 4), contribs: make(chan transport.Contribution, 16)}
	if _, err := conn.Subscribe(transport.TopicNodes, func(m transport.Message) {
		switch v := m.(type) {
		case transport.Join:
			h.joins <- v
		case transport.Leave:
			h.leaves <- v
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Subscribe(transport.TopicContributions, func(m transport.Message) {
		h.contribs <- m.(transport.Contribution)
	}); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *leaderHarness) publish(m transport.Message) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nodeTestWait)
	defer cancel()
	if err := h.conn.Publish(ctx, m); err != nil {
		h.t.Fatal(err)
	}
}

func recvWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(nodeTestWait):
		t.Fatalf("no %s within %v", what, nodeTestWait)
		var zero T
		return zero
	}
}

// TestNodeEndToEnd runs the node command, configured by a run file,
// against a leader played by the test. The node reports its shard and its
// seeded sampling in Join; it refuses a round naming another q and C (and
// does not follow its higher term), answers two rounds of the run's q =
// B/N and C, then ends on Done: the command returns nil.
func TestNodeEndToEnd(t *testing.T) {
	const run = "cli-e2e"
	h := newLeaderHarness(t, run)
	spec, m := writeSpec(t)
	runFile := writeRunFile(t, "run: "+run, "model_spec: "+spec)
	var logs lockedBuffer
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*nodeTestWait)
	defer cancel()
	go func() {
		done <- runNodeCmd(ctx, &logs, "--config", runFile, "--nats", h.conn.ServerURL(), "--id", "n1",
			"--shard-index", "1", "--shard-count", "2",
			"--heartbeat", "50ms", "--insecure-seed", "3", "--metrics-addr", "127.0.0.1:0", "--device", "cpu",
			"--log-format", "json", "--log-level", "debug")
	}()

	j := recvWithin(t, h.joins, "join")
	// 12000 gaussian rows, 2000 held out, 10000 in two shards.
	if j.Incarnation == "" {
		t.Errorf("join has no incarnation")
	}
	// The content hash of its shard, which the run binds its ID to.
	if j.DataHash == "" || !transport.ValidWeights(j.DataHash) {
		t.Errorf("join's data hash %q: want the shard's SHA-256", j.DataHash)
	}
	want := transport.Join{Run: run, NodeID: "n1", ShardSize: 5000, ModelHash: m.Hash(),
		ShardIndex: 1, ShardCount: 2, ShardSeed: 1, SeedPolicy: seed.Seeded, Incarnation: j.Incarnation, DataHash: j.DataHash}
	if j != want {
		t.Fatalf("join = %+v, want %+v", j, want)
	}
	h.publish(transport.Leader{Run: run, ReplicaID: "r1", Term: 1})
	recvWithin(t, h.joins, "join for the leader")
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 1); err != nil {
		t.Fatal(err)
	}
	// A round of another run (or a forgery) asking for the unclipped sum
	// of the whole shard: refused, and its term not followed.
	h.publish(transport.RoundStart{Run: run, Step: 1, RoundID: 99, Term: 7, Leader: "mallory", Params: theta,
		ParamsVersion: 0, Deadline: time.Now().Add(nodeTestWait).UnixNano(), SampleRate: 1, ClipNorm: 1e6, ModelHash: m.Hash()})
	for step := uint64(1); step <= 2; step++ {
		h.publish(transport.Params{Run: run, Step: step - 1, Version: step - 1, Term: 1, Values: theta})
		h.publish(transport.RoundStart{Run: run, Step: step, RoundID: 100 + step, Term: 1, Leader: "r1",
			ParamsVersion: step - 1, Deadline: time.Now().Add(nodeTestWait).UnixNano(), SampleRate: 0.01, ClipNorm: 1,
			ModelHash: m.Hash()})
		c := recvWithin(t, h.contribs, "contribution")
		if c.Step != step || c.RoundID != 100+step || c.NodeID != "n1" || len(c.Sum) != m.NumParams() {
			t.Fatalf("contribution %d/%d from %s with %d values", c.Step, c.RoundID, c.NodeID, len(c.Sum))
		}
		theta[0] += 0.1
	}
	scrapeNodeMetrics(t, &logs)

	h.publish(transport.Status{Run: run, From: "r1", Code: transport.StatusDone})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("node command = %v\nlogs:\n%s", err, logs.String())
		}
	case <-time.After(nodeTestWait):
		t.Fatal("node command did not return after Done")
	}
	if lv := recvWithin(t, h.leaves, "leave"); lv.NodeID != "n1" || lv.Reason != "done" {
		t.Errorf("leave = %+v", lv)
	}
	out := logs.String()
	if !strings.Contains(out, "NOT differentially private") {
		t.Error("--insecure-seed was not logged loudly")
	}
	// The device, in the command's startup record and the worker's.
	info := cpuInfo(t)
	fields := fmt.Sprintf(`"device":"cpu","device_name":%q,"device_memory_bytes":0,"compute_capability":""`, info.Name)
	for _, msg := range []string{`"msg":"compute device"`, `"msg":"node: start"`} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			found = found || strings.Contains(line, msg) && strings.Contains(line, fields)
		}
		if !found {
			t.Errorf("no %s log record with %s:\n%s", msg, fields, out)
		}
	}
	for _, key := range []string{`"count"`, `"sum"`} {
		if strings.Contains(out, key) {
			t.Errorf("logs hold %s", key)
		}
	}
}

// scrapeNodeMetrics finds the metrics URL in the logs and checks the
// rounds counter.
func scrapeNodeMetrics(t *testing.T, logs *lockedBuffer) {
	t.Helper()
	var url string
	for _, line := range strings.Split(logs.String(), "\n") {
		if i := strings.Index(line, `"url":"`); i >= 0 && strings.Contains(line, "serving metrics") {
			url = line[i+len(`"url":"`):]
			url = url[:strings.IndexByte(url, '"')]
		}
	}
	if url == "" {
		t.Fatalf("no metrics URL in the logs:\n%s", logs.String())
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`dpcluster_node_rounds_total{node="n1",result="answered",run="cli-e2e"} 2`,
		`dpcluster_node_rounds_total{node="n1",result="skipped_params_mismatch",run="cli-e2e"} 1`,
		fmt.Sprintf(`dpcluster_node_device_info{compute_capability="",device="cpu",name=%q,node="n1",run="cli-e2e"} 1`, cpuInfo(t).Name),
		`dpcluster_node_device_memory_bytes{node="n1",run="cli-e2e"} 0`,
		"# TYPE go_goroutines gauge", "# TYPE process_cpu_seconds_total counter",
		"# TYPE dpcluster_build_info gauge", `goversion="` + runtime.Version() + `"`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	// Every dpcluster series names its run.
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "dpcluster_node_") && !strings.Contains(line, `run="cli-e2e"`) {
			t.Errorf("series without its run: %s", line)
		}
	}
}

// cpuInfo describes the CPU device.
func cpuInfo(t *testing.T) model.DeviceInfo {
	t.Helper()
	dev, err := model.OpenDevice("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	return dev.Info()
}

// TestNodeInterrupted cancels the command's context (as SIGINT does): it
// leaves the run and returns nil.
func TestNodeInterrupted(t *testing.T) {
	const run = "cli-int"
	h := newLeaderHarness(t, run)
	spec, _ := writeSpec(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runNodeCmd(ctx, io.Discard, "--nats", h.conn.ServerURL(), "--id", "n2",
			"--config", writeRunFile(t, "run: "+run, "model_spec: "+spec))
	}()
	recvWithin(t, h.joins, "join")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("node command = %v, want nil", err)
		}
	case <-time.After(nodeTestWait):
		t.Fatal("node command did not return after cancel")
	}
	if lv := recvWithin(t, h.leaves, "leave"); lv.Reason != "shutdown" {
		t.Errorf("leave = %+v", lv)
	}
}

func TestServeMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "dpcluster_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	ctx, cancel := context.WithCancel(context.Background())
	bound, done, err := serveMetrics(ctx, "127.0.0.1:0", reg, nil, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + bound + "/metrics")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "dpcluster_test_total 3") {
		t.Errorf("metrics = %s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("done = %v, want nil", err)
		}
	case <-time.After(nodeTestWait):
		t.Fatal("metrics server did not stop")
	}
	if _, err := http.Get("http://" + bound + "/metrics"); err == nil {
		t.Error("metrics still served after ctx ended")
	}
	// A busy address is an error at once.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	b2, done2, err := serveMetrics(ctx2, "127.0.0.1:0", reg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := serveMetrics(ctx2, b2, reg, nil, nil); err == nil {
		t.Error("second server on a bound address: no error")
	}
	cancel2()
	<-done2
}

func TestDefaultNodeID(t *testing.T) {
	id := defaultNodeID()
	if !node.ValidID(id) {
		t.Errorf("default node ID %q is not valid", id)
	}
	if !strings.HasSuffix(id, fmt.Sprintf("-%d", os.Getpid())) {
		t.Errorf("default node ID %q does not end in the process ID", id)
	}
}

// TestNodeSkipsCalibration: a node takes N, q, C and the run's name from
// the configuration the replicas derive, and not σ, which it never uses
// (the noise is the leader's); so it does not calibrate σ, which with the
// PLD accountant took seconds on every node start. Its configuration
// agrees with a replica's on everything it uses and leaves σ at 0.
func TestNodeSkipsCalibration(t *testing.T) {
	spec := defaultRunSpec()
	fs := pflag.NewFlagSet("node", pflag.ContinueOnError)
	spec.bind(fs)
	if err := fs.Parse([]string{"--dataset", "gaussian", "--model", "logreg", "--batch-size", "100",
		"--max-steps", "100", "--accountant", "rdp"}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	pr, shard, err := loadNodeShard(t.Context(), spec, 0, 2, log)
	if err != nil {
		t.Fatal(err)
	}
	replica, err := spec.prepare(t.Context(), false, "", log)
	if err != nil {
		t.Fatal(err)
	}
	n, r := pr.cfg, replica.cfg
	if n.Run != r.Run || n.TotalExamples != r.TotalExamples || n.SampleRate != r.SampleRate ||
		n.Optimizer.ClipNorm != r.Optimizer.ClipNorm || n.ModelHash != r.ModelHash {
		t.Errorf("node's configuration %+v disagrees with the replica's %+v", n, r)
	}
	if n.Optimizer.NoiseMultiplier != 0 || !(r.Optimizer.NoiseMultiplier > 0) {
		t.Errorf("σ: node %v (want 0: not calibrated), replica %v (want calibrated)", n.Optimizer.NoiseMultiplier, r.Optimizer.NoiseMultiplier)
	}
	if shard.Len() != int(r.TotalExamples)/2 {
		t.Errorf("shard of %d examples, want half of %d", shard.Len(), r.TotalExamples)
	}
}

// TestRegistryConventions: the registry every command exports from has the
// Go runtime's and the process's collectors and dpcluster_build_info (1,
// labelled with the Go version).
func TestRegistryConventions(t *testing.T) {
	mfs, err := newRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
		if mf.GetName() != "dpcluster_build_info" {
			continue
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if m.GetGauge().GetValue() != 1 || labels["goversion"] != runtime.Version() {
			t.Errorf("dpcluster_build_info = %v %v", m.GetGauge().GetValue(), labels)
		}
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes", "dpcluster_build_info"} {
		if !have[name] {
			t.Errorf("the registry lacks %s", name)
		}
	}
}

// Command step times the distributed training step on the real path: the
// same construction as `coordinator local` (cli.RunLocal): an
// embedded NATS server, one Raft replica with its durable log and privacy
// ledger in a temporary directory, and k in-process node.Workers, training
// on Fashion-MNIST with the leader's default (discrete) noise.
//
// For every model and node count it runs one child process (so that each
// configuration's peak RSS is its own) and prints a table:
//
//   - step: wall time per step after the warm-up, from the leader's
//     applied-step callback (mean; p50 in brackets);
//   - compute: the nodes' own time to sample and compute one clipped sum
//     (dpcluster_node_compute_seconds, mean over the measured steps and
//     the nodes; the slowest node in brackets);
//   - step/compute: the overhead ratio, against the slowest node;
//   - engine: the engine's own DP step, Workspace.ClippedSum on B random
//     examples in the same process after the run (BenchmarkMLPStep/dp's
//     operation), and step/engine, the "≤ 1.25 × engine" ratio;
//   - peak RSS (VmHWM) and the peak live heap (sampled every step).
//
// Then a second table, where a step goes: the leader's round_seconds
// (RoundStart to the round's close: the nodes' work and both transfers)
// and step_phase_seconds (privatize, commit, release), mean ms per
// measured step, and the rest of the step.
//
// Then, measured in the same process on the same machine: the floor of a
// step (measureFloor: 4·d bytes through an embedded NATS server to every
// node and back, and one fsync of a small record), step/floor, and the
// size of the run's data dir at its end.
//
// -engine null gives the nodes an engine that costs nothing (nullEngine: a
// deterministic, exactly clipped sum of the right shape), so the step is
// the system's alone; it is selectable here only, never in a product
// binary. -device cuda:N runs the nodes on a GPU (a binary built with
// -tags cuda). -json FILE writes the results as a list of objects (model,
// setting, params, trainable_params, bytes_per_step, nodes, engine,
// step_ms, compute_ms, floor_ms, phase_ms, peak_rss_bytes,
// data_dir_bytes, and more).
//
// Usage (docs/BENCHMARKS.md, "The distributed step"):
//
//	go run ./bench/step -models mlp,784-2048-1024-10 -nodes 1,3 -steps 40
//	go run -tags openblas ./bench/step ...   (the OpenBLAS back end)
//	go run ./bench/step -engine null -models 784-4096-4096-10 -nodes 1 -json step.json
//	go run ./bench/step -models bert-small -trainable 'full;last-block' -nodes 1,3 -batch 8 -steps 3 -warmup 1
//
// A model is a preset name (mlp, cnn, ...), an MLP written as its layer
// widths, 784-H1-...-10, passed to local as a --model-spec file, or a
// BERT-shaped encoder with random weights, bert-base (BERT-base: 12
// layers, hidden 768, 12 heads, intermediate 3072, vocabulary 30522, 512
// positions, 2 token types) or bert-small (4 layers, 256 wide, 4 heads,
// intermediate 1024), over -seq-len tokens (128). An encoder runs as a
// fine-tuning run does (bert.go: local --init-from a checkpoint folder of
// random weights the parent writes once, on made-up text that fills every
// token), in each of the -trainable settings: full, last-block (the last
// block and the head, layer.<L-1>.*, pooler.*, classifier.*) or patterns.
// A setting that freezes layers holds their values once in the child's
// process, in the one model its in-process nodes share; θ, the sums, the
// noise, the optimizer and the log hold the trainable parameters only.
//
// Every configuration reports its parameters, those that train
// (trainable_params) and the bytes that crossed the network per measured
// step (bytes_per_step, measured: what the run's embedded NATS server
// delivered to its clients, θ to every node and every node's sum back as
// the transport encoded them, with the round's small messages).
// -cpuprofile DIR writes one CPU profile per configuration, covering the
// measured steps only; -memprofile DIR one heap profile per configuration,
// at the last step after a collection.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/cli"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/internal/procstat"
	"github.com/dpcluster/dpcluster/model"
)

// result is what one child reports to the parent, as one JSON line.
type result struct {
	Model string `json:"model"`
	// Setting is what trains: "full", or a BERT-shaped encoder's
	// -trainable setting.
	Setting string `json:"setting"`
	// Params is the model's parameters, frozen ones included;
	// TrainableParams those that train (θ's length: what every step
	// sends, sums, noises and logs).
	Params          int `json:"params"`
	TrainableParams int `json:"trainable_params"`
	// BytesPerStep is what crossed the network per measured step: the
	// bytes the run's embedded NATS server delivered to its clients (θ to
	// every node, every node's sum to the leader, and the small messages
	// of the round), as the transport encoded them
	// (dpcluster_transport_delivered_bytes_total), over the measured steps.
	BytesPerStep float64 `json:"bytes_per_step"`
	Nodes        int     `json:"nodes"`
	Backend      string  `json:"backend"`
	Noise        string  `json:"noise"`
	Steps        int     `json:"steps"` // measured steps
	StepMean     float64 `json:"step_ms"`
	StepP50      float64 `json:"step_p50_ms"`
	ComputeAvg   float64 `json:"compute_ms"`     // mean over nodes and steps
	ComputeMax   float64 `json:"compute_max_ms"` // the slowest node's mean
	EngineDP     float64 `json:"engine_dp_ms"`
	Engine       string  `json:"engine"`   // "null", or the device's ID and name
	Device       string  `json:"device"`   // --device
	FloorMS      float64 `json:"floor_ms"` // measureFloor
	DataDir      int64   `json:"data_dir_bytes"`
	// The leader's links, mean ms per measured step: the round (RoundStart
	// to close: the nodes' work and both transfers), then the
	// step_phase_seconds phases.
	Collect   float64 `json:"collect_ms"`
	Privatize float64 `json:"privatize_ms"`
	Commit    float64 `json:"commit_ms"`
	Release   float64 `json:"release_ms"`
	// Log is the grad entry's link (proposal to applied on the leader),
	// off the chain: it overlaps the release and the next round. Charge
	// is the charge entry's, also off the chain: it overlaps the release
	// and the round, and the step waits only for what is left of it
	// (Commit).
	Log      float64 `json:"log_ms"`
	Charge   float64 `json:"charge_ms"`
	PeakRSS  int64   `json:"peak_rss_bytes"`
	PeakHeap uint64  `json:"peak_live_heap_bytes"`
	Profile  string  `json:"profile,omitempty"`
}

const resultPrefix = "RESULT "

type flags struct {
	models, nodes string
	trainable     string // BERT-shaped encoders' settings (parseSettings)
	seqLen        int    // BERT-shaped encoders' tokens per example
	fixture       string // a BERT-shaped encoder's fixture (writeBERTFixture): the parent's, passed to its children
	roundTimeout  time.Duration
	engine        string
	device        string
	dataset       string
	data          string
	jsonOut       string
	floorReps     int
	steps, warmup int
	batch         int
	noise         string
	evalEvery     int
	engineIters   int
	cpuprofile    string
	memprofile    string
	child         bool
	verbose       bool
}

func main() {
	var f flags
	flag.StringVar(&f.models, "models", "mlp,784-2048-1024-10", "models: presets, MLP widths 784-H1-...-10, or BERT-shaped encoders bert-base and bert-small, comma-separated")
	flag.StringVar(&f.trainable, "trainable", settingFull, "BERT-shaped encoders: what trains, settings separated by ';', each full, last-block (layer.<L-1>.*, pooler.*, classifier.*) or comma-separated patterns over the parameters' names (layer.11.*,pooler.*,classifier.*); other models train in full")
	flag.IntVar(&f.seqLen, "seq-len", 128, "BERT-shaped encoders: tokens per example")
	flag.StringVar(&f.fixture, "bert-fixture", "", "a BERT-shaped encoder's checkpoint and text written by the parent (empty: write them in the child's temporary directory)")
	flag.DurationVar(&f.roundTimeout, "round-timeout", 30*time.Minute, "local's --round-timeout (a BERT-base step takes tens of seconds on 2 cores)")
	flag.StringVar(&f.nodes, "nodes", "1,3", "in-process node counts, comma-separated")
	flag.IntVar(&f.steps, "steps", 40, "measured steps per configuration")
	flag.IntVar(&f.warmup, "warmup", 5, "steps run before measuring")
	flag.IntVar(&f.batch, "batch", 256, "expected batch size B")
	flag.StringVar(&f.noise, "noise", "discrete", "leader's noise: discrete (the default of local) or float")
	flag.IntVar(&f.evalEvery, "eval-every", 0, "local's --eval-every (0: evaluate only after the last step)")
	flag.IntVar(&f.engineIters, "engine-iters", 10, "engine DP steps timed after the run")
	flag.StringVar(&f.cpuprofile, "cpuprofile", "", "directory for one CPU profile per configuration (measured steps only)")
	flag.StringVar(&f.memprofile, "memprofile", "", "directory for one heap profile per configuration, written at the last step after a collection")
	flag.BoolVar(&f.child, "child", false, "run one configuration (-models and -nodes each one value) and print its result as JSON")
	flag.BoolVar(&f.verbose, "v", false, "pass the runs' logs through")
	flag.StringVar(&f.engine, "engine", "device", "the nodes' engine: device (the real one on -device) or null (costs nothing: times the system around it)")
	flag.StringVar(&f.device, "device", "cpu", "local's --device: cpu or cuda:N (a binary built with -tags cuda)")
	flag.StringVar(&f.dataset, "dataset", "fashion-mnist", "local's --dataset")
	flag.StringVar(&f.data, "data", "", "local's --data (Fashion-MNIST directory; empty: local's search)")
	flag.StringVar(&f.jsonOut, "json", "", "also write the results to this file as a JSON list")
	flag.IntVar(&f.floorReps, "floor-reps", 3, "repetitions of the floor measurement (median)")
	flag.Parse()
	var err error
	if f.child {
		err = child(f)
	} else {
		err = parent(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "step:", err)
		os.Exit(1)
	}
}

// parent runs one child per configuration and prints the table.
func parent(f flags) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, dir := range []string{f.cpuprofile, f.memprofile} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	settings, err := parseSettings(f.trainable)
	if err != nil {
		return err
	}
	fixtures, err := os.MkdirTemp("", "dpcluster-bench-bert-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(fixtures)
	var results []result
	for _, m := range strings.Split(f.models, ",") {
		sets, fixture := []string{settingFull}, ""
		if shape, ok := bertShapes[m]; ok {
			sets, fixture = settings, filepath.Join(fixtures, m)
			if err := writeBERTFixture(fixture, shape, f.seqLen); err != nil {
				return fmt.Errorf("%s: %w", m, err)
			}
		}
		for _, st := range sets {
			for _, k := range strings.Split(f.nodes, ",") {
				r, err := runOne(self, f, m, st, fixture, k)
				if err != nil {
					return err
				}
				results = append(results, r)
				fmt.Fprintf(os.Stderr, "done: %s %s k=%d\n", r.Model, r.Setting, r.Nodes)
			}
		}
	}
	printTable(os.Stdout, results)
	if f.jsonOut != "" {
		return writeJSON(f.jsonOut, results)
	}
	return nil
}

// runOne runs model m in setting st with k nodes in a child process.
func runOne(self string, f flags, m, st, fixture, k string) (result, error) {
	args := []string{"-child", "-models", m, "-nodes", k, "-engine", f.engine, "-device", f.device,
		"-trainable", st, "-seq-len", strconv.Itoa(f.seqLen), "-bert-fixture", fixture,
		"-round-timeout", f.roundTimeout.String(),
		"-dataset", f.dataset, "-data", f.data, "-floor-reps", strconv.Itoa(f.floorReps),
		"-steps", strconv.Itoa(f.steps), "-warmup", strconv.Itoa(f.warmup), "-batch", strconv.Itoa(f.batch),
		"-noise", f.noise, "-eval-every", strconv.Itoa(f.evalEvery), "-engine-iters", strconv.Itoa(f.engineIters),
		"-cpuprofile", f.cpuprofile, "-memprofile", f.memprofile, "-v=" + strconv.FormatBool(f.verbose)}
	cmd := exec.Command(self, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return result{}, fmt.Errorf("%s %s, %s nodes: %w\n%s", m, st, k, err, out.String())
	}
	r, err := parseResult(out.String())
	if err != nil {
		return result{}, fmt.Errorf("%s %s, %s nodes: %w", m, st, k, err)
	}
	return r, nil
}

// jsonResult is one configuration in -json's list.
type jsonResult struct {
	Model        string             `json:"model"`
	Setting      string             `json:"setting"`
	Params       int                `json:"params"`
	Trainable    int                `json:"trainable_params"`
	BytesPerStep float64            `json:"bytes_per_step"`
	Nodes        int                `json:"nodes"`
	Engine       string             `json:"engine"`
	Device       string             `json:"device"`
	Backend      string             `json:"backend"`
	Steps        int                `json:"steps"`
	StepMS       float64            `json:"step_ms"`
	StepP50MS    float64            `json:"step_p50_ms"`
	ComputeMS    float64            `json:"compute_ms"`
	ComputeMaxMS float64            `json:"compute_max_ms"`
	FloorMS      float64            `json:"floor_ms"`
	PhaseMS      map[string]float64 `json:"phase_ms"`
	EngineDPMS   float64            `json:"engine_dp_ms"`
	PeakRSS      int64              `json:"peak_rss_bytes"`
	PeakHeap     uint64             `json:"peak_live_heap_bytes"`
	DataDir      int64              `json:"data_dir_bytes"`
}

// writeJSON writes the results to path as a JSON list.
func writeJSON(path string, rs []result) error {
	out := make([]jsonResult, len(rs))
	for i, r := range rs {
		out[i] = jsonResult{Model: r.Model, Setting: r.Setting, Params: r.Params, Trainable: r.TrainableParams,
			BytesPerStep: r.BytesPerStep, Nodes: r.Nodes, Engine: r.Engine, Device: r.Device,
			Backend: r.Backend, Steps: r.Steps, StepMS: r.StepMean, StepP50MS: r.StepP50, ComputeMS: r.ComputeAvg,
			ComputeMaxMS: r.ComputeMax, FloorMS: r.FloorMS, EngineDPMS: r.EngineDP, PeakRSS: r.PeakRSS,
			PeakHeap: r.PeakHeap, DataDir: r.DataDir,
			PhaseMS: map[string]float64{"round": r.Collect, "privatize": r.Privatize, "commit": r.Commit,
				"release": r.Release, "rest": r.StepMean - r.Collect - r.Privatize - r.Commit - r.Release,
				"log (off the chain)": r.Log, "charge (off the chain)": r.Charge}}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func parseResult(out string) (result, error) {
	var r result
	for _, line := range strings.Split(out, "\n") {
		if s, ok := strings.CutPrefix(line, resultPrefix); ok {
			return r, json.Unmarshal([]byte(s), &r)
		}
	}
	return r, errors.New("no result line")
}

func printTable(w io.Writer, rs []result) {
	if len(rs) > 0 {
		fmt.Fprintf(w, "back end %s, engine %s on %s, noise %s, %d measured steps after %s, GOMAXPROCS %d\n\n",
			rs[0].Backend, rs[0].Engine, rs[0].Device, rs[0].Noise, rs[0].Steps, "warm-up", runtime.GOMAXPROCS(0))
	}
	fmt.Fprintln(w, "| model | setting | params | trainable | k | step ms (p50) | node compute ms (slowest) | step / compute | engine DP ms | step / engine | floor ms | step / floor | MB per step | peak RSS MB | peak live heap MB | data dir MB |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %.1f (%.1f) | %.2f (%.2f) | %.2f | %.2f | %.2f | %.1f | %.2f | %.2f | %.0f | %.0f | %.0f |\n",
			r.Model, r.Setting, r.Params, r.TrainableParams, r.Nodes, r.StepMean, r.StepP50, r.ComputeAvg, r.ComputeMax,
			r.StepMean/r.ComputeMax, r.EngineDP, r.StepMean/r.EngineDP, r.FloorMS, r.StepMean/r.FloorMS,
			r.BytesPerStep/1e6, float64(r.PeakRSS)/(1<<20), float64(r.PeakHeap)/(1<<20), float64(r.DataDir)/(1<<20))
	}
	fmt.Fprintln(w, "\nWhere a step goes (leader's metrics, mean ms per step):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| model | setting | k | step | round (RoundStart to close) | of which node compute (slowest) | privatize | commit | release | rest | charge (off the chain) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
			r.Model, r.Setting, r.Nodes, r.StepMean, r.Collect, r.ComputeMax, r.Privatize, r.Commit, r.Release,
			r.StepMean-r.Collect-r.Privatize-r.Commit-r.Release, r.Charge)
	}
}

// child runs one configuration and prints its result.
func child(f flags) error {
	r, err := runChild(f)
	if err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fmt.Println(resultPrefix + string(b))
	return nil
}

// runChild runs one configuration in this process: the run, then the
// engine's own step and the floor.
func runChild(f flags) (result, error) {
	k, err := strconv.Atoi(f.nodes)
	if err != nil || k < 1 {
		return result{}, fmt.Errorf("-nodes %q: one count ≥ 1 in a child", f.nodes)
	}
	if f.steps < 2 || f.warmup < 1 {
		return result{}, errors.New("-steps must be ≥ 2 and -warmup ≥ 1")
	}
	dir, err := os.MkdirTemp("", "dpcluster-bench-step-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	if f.trainable == "" {
		f.trainable = settingFull
	}
	var (
		m         *model.Model
		modelArgs []string
		bert      bertRun
		setting   = settingFull
	)
	if _, ok := bertShapes[f.models]; ok {
		fixture := f.fixture
		if fixture == "" {
			fixture = filepath.Join(dir, "bert")
		}
		if bert, err = prepareBERT(f.models, f.trainable, fixture, f.seqLen); err != nil {
			return result{}, err
		}
		m, modelArgs, setting = bert.model, bert.args, f.trainable
	} else {
		if f.trainable != settingFull {
			return result{}, fmt.Errorf("-trainable %s: %s trains in full (-trainable chooses the layers of a BERT-shaped encoder)", f.trainable, f.models)
		}
		spec, args, err := modelFlags(f.models, dir)
		if err != nil {
			return result{}, err
		}
		if m, err = model.New(spec); err != nil {
			return result{}, err
		}
		modelArgs = args
	}
	name := f.models
	if setting != settingFull {
		name += "-" + strings.NewReplacer("*", "", ",", "_", "/", "_").Replace(setting)
	}
	reg := prometheus.NewRegistry()
	total := f.warmup + f.steps
	rec := &recorder{warmup: int64(f.warmup), total: int64(total), reg: reg}
	if f.cpuprofile != "" {
		rec.profile = filepath.Join(f.cpuprofile, fmt.Sprintf("%s-k%d.pprof", name, k))
	}
	if f.memprofile != "" {
		rec.heapProfile = filepath.Join(f.memprofile, fmt.Sprintf("%s-k%d.heap.pprof", name, k))
	}
	dataDir := filepath.Join(dir, "data")
	args := append(modelArgs, "--data-dir", dataDir, "--nodes", strconv.Itoa(k),
		"--max-steps", strconv.Itoa(total), "--batch-size", strconv.Itoa(f.batch), "--noise", f.noise,
		"--eval-every", strconv.Itoa(f.evalEvery), "--progress", "off", "--run", "bench-step",
		"--device", f.device)
	if f.roundTimeout > 0 {
		args = append(args, "--round-timeout", f.roundTimeout.String())
	}
	if bert.model == nil {
		args = append(args, "--dataset", f.dataset)
		if f.data != "" {
			args = append(args, "--data", f.data)
		}
	}
	hooks := cli.LocalHooks{Registry: reg, OnStep: rec.onStep}
	var dev model.Device
	switch f.engine {
	case "null":
		dev = nullDevice{}
		hooks.Device = dev
	case "device":
		if dev, err = model.OpenDevice(f.device); err != nil {
			return result{}, err
		}
		defer dev.Close()
	default:
		return result{}, fmt.Errorf("-engine %q: want device or null", f.engine)
	}
	// The run's logs go to a file, not to memory, unless -v.
	logs, err := os.Create(filepath.Join(dir, "local.log"))
	if err != nil {
		return result{}, err
	}
	defer logs.Close()
	var w io.Writer = logs
	if f.verbose {
		w = os.Stderr
	}
	if err := cli.RunLocal(context.Background(), args, io.Discard, w, hooks); err != nil {
		rec.stopProfile()
		tail, _ := os.ReadFile(logs.Name())
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return result{}, fmt.Errorf("local: %w\n%s", err, tail)
	}
	rec.stopProfile()
	r, err := rec.result()
	if err != nil {
		return r, err
	}
	if r.PeakRSS, err = procstat.PeakRSS(); err != nil {
		return r, err
	}
	if r.DataDir, err = dirBytes(dataDir); err != nil {
		return r, err
	}
	r.Model, r.Setting, r.Params, r.TrainableParams = m.Spec().Name, setting, m.NumFullParams(), m.NumParams()
	if bert.model != nil {
		r.Model = f.models
	}
	r.Nodes, r.Backend, r.Noise, r.Profile = k, model.DefaultBackend().Name(), f.noise, rec.profile
	r.Engine, r.Device = f.engine, f.device
	if f.engine == "device" {
		r.Engine = dev.Info().ID + " (" + dev.Info().Name + ")"
	}
	if bert.model != nil {
		if m, err = bert.engineModel(); err != nil {
			return r, err
		}
	}
	runtime.GC() // the run's garbage, not the engine, should pay for its collection
	if r.EngineDP, err = engineStep(dev, m, f.batch, f.engineIters); err != nil {
		return r, err
	}
	if r.FloorMS, err = measureFloor(m.NumParams(), k, dir, f.floorReps); err != nil {
		return r, err
	}
	return r, nil
}

// dirBytes is the total size of the regular files under dir.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	return n, err
}

// modelFlags returns the spec of name and local's flags for it: a preset,
// or an MLP given as widths 784-H1-...-10 written as a spec file in dir.
func modelFlags(name, dir string) (model.Spec, []string, error) {
	if !strings.Contains(name, "-") {
		spec, err := model.Preset(name)
		return spec, []string{"--model", name}, err
	}
	parts := strings.Split(name, "-")
	widths := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return model.Spec{}, nil, fmt.Errorf("model %q: widths must be positive integers", name)
		}
		widths[i] = n
	}
	if len(widths) < 3 || widths[0] != 28*28 {
		return model.Spec{}, nil, fmt.Errorf("model %q: want 784-H1-...-classes for Fashion-MNIST", name)
	}
	spec := model.MLP([]int{1, 28, 28}, widths[1:len(widths)-1], widths[len(widths)-1])
	spec.Name = "mlp-" + strings.Join(parts[1:len(parts)-1], "-")
	b, err := json.Marshal(spec)
	if err != nil {
		return spec, nil, err
	}
	path := filepath.Join(dir, "model.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return spec, nil, err
	}
	return spec, []string{"--model-spec", path}, nil
}

// engineStep times the engine's own DP step on dev (ClippedSumIndexed on
// B random rows, as a node calls it): the mean of iters steps after one
// warm-up step, in ms.
func engineStep(dev model.Device, m *model.Model, B, iters int) (float64, error) {
	e, err := dev.NewEngine(m, B)
	if err != nil {
		return 0, err
	}
	defer e.Close()
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 1); err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	d := &dataset.Dataset{Name: "engine-step", Dim: m.InputSize(), Shape: m.InputShape(), Classes: m.Classes(),
		X: make([]float32, B*m.InputSize()), Y: make([]int32, B)}
	vocab := 0
	if ls := m.Spec().Layers; len(ls) > 0 && ls[0].Type == model.Embedding {
		vocab = ls[0].Vocab // token ids: made-up words, past BERT's special tokens
	}
	d.Vocab = vocab
	for i := range d.X {
		d.X[i] = rng.Float32()
		if vocab > 0 {
			d.X[i] = float32(5 + rng.IntN(vocab-5))
		}
	}
	for i := range d.Y {
		d.Y[i] = int32(rng.IntN(m.Classes()))
	}
	idx := make([]int, B)
	for i := range idx {
		idx[i] = i
	}
	dst := make([]float32, m.NumParams())
	if _, err := e.ClippedSumIndexed(dst, theta, d, idx, 1); err != nil {
		return 0, err
	}
	start := time.Now()
	for range iters {
		if _, err := e.ClippedSumIndexed(dst, theta, d, idx, 1); err != nil {
			return 0, err
		}
	}
	return time.Since(start).Seconds() * 1e3 / float64(iters), nil
}

package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/node"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
)

// localResult is the --json output of `coordinator local`.
type localResult struct {
	Run   string `json:"run"`
	Steps int64  `json:"steps"`
	// ChargedStep is the step Epsilon runs through, the ledger's last
	// charge: Steps, or Steps+1 when the run ended between a step's
	// charge and its update (that step is charged and never applied).
	ChargedStep   int64   `json:"charged_step"`
	Epsilon       float64 `json:"epsilon"`
	Delta         float64 `json:"delta"`
	TargetEpsilon float64 `json:"target_epsilon"`
	Sigma         float64 `json:"noise_multiplier"`
	SampleRate    float64 `json:"sample_rate"`
	Stopped       string  `json:"stopped"`
	// EvalData labels the final evaluation (coordinator.EvalData.Label):
	// "test" on public data, "NON-PRIVATE holdout" on rows held out of the
	// private training file, "none" without evaluation data. The metrics
	// come under the matching keys (EvalData.Key), so a holdout's accuracy
	// never appears as test_accuracy.
	EvalData     string   `json:"eval_data"`
	TestAccuracy *float64 `json:"test_accuracy,omitempty"`
	TestLoss     *float64 `json:"test_loss,omitempty"`
	TestExamples *int     `json:"test_examples,omitempty"`
	// TestPerplexity and TestTokens: a next-token model's evaluation
	// (TestLoss is then nats per token).
	TestPerplexity            *float64 `json:"test_perplexity,omitempty"`
	TestTokens                *int     `json:"test_tokens,omitempty"`
	NonPrivateHoldoutAccuracy *float64 `json:"nonprivate_holdout_accuracy,omitempty"`
	NonPrivateHoldoutLoss     *float64 `json:"nonprivate_holdout_loss,omitempty"`
	NonPrivateHoldoutExamples *int     `json:"nonprivate_holdout_examples,omitempty"`
	Ledger                    string   `json:"ledger"`
	// Model is the trained model written into the data dir
	// (ModelFile, by exportModel) and StateSHA256 the state digest
	// (coordinator.Summary.Digest) of the replica that ran it.
	Model string `json:"model"`
	// Finetuned is, for a run started from a pretrained checkpoint, the
	// folder holding the model in the checkpoint's own format
	// (FinetunedDir).
	Finetuned   string  `json:"finetuned,omitempty"`
	StateSHA256 string  `json:"state_sha256"`
	Seconds     float64 `json:"seconds"`
	// Timing splits Seconds: until the first step's release, between the
	// first and the last step's releases, and after the last (the final
	// evaluation, the export, shutting down), each in seconds.
	Timing struct {
		ToFirstStep   float64 `json:"to_first_step"`
		Stepping      float64 `json:"stepping"`
		AfterLastStep float64 `json:"after_last_step"`
	} `json:"timing"`
	// Private is false when the run used seeded (predictable) noise.
	Private bool `json:"private"`
	// NoiseMode is the leader's noise mechanism: discrete, float, or ""
	// for a run configured before noise modes (float).
	NoiseMode string `json:"noise_mode"`
	// Accountant is the accountant that enforced the budget and
	// calibrated σ: pld or rdp (rdp for a run configured before the field).
	Accountant string `json:"accountant"`
}

// stepTrained reports whether p, reported to ServerConfig.OnStep, is a
// step applied by this run rather than an evaluation (those come with
// EvalStep set: of a step of this run, or, at the end, of the final θ, also
// when the data dir held a run that had finished before, which trains
// nothing).
func stepTrained(p coordinator.Progress) bool { return p.EvalStep == 0 }

// setFinalEval fills the final evaluation's fields: the test_ keys for
// public data (coordinator.EvalData.Private), the nonprivate_holdout_
// keys (EvalData.Key) otherwise.
func (r *localResult) setFinalEval(sum coordinator.Summary) {
	if !sum.FinalEvaluated {
		return
	}
	m := sum.Final
	if sum.EvalData.Private() {
		r.TestAccuracy, r.TestLoss, r.TestExamples = &m.Accuracy, &m.Loss, &m.N
		if m.Tokens > 0 {
			ppl := m.Perplexity()
			r.TestPerplexity, r.TestTokens = &ppl, &m.Tokens
		}
	} else {
		r.NonPrivateHoldoutAccuracy, r.NonPrivateHoldoutLoss, r.NonPrivateHoldoutExamples = &m.Accuracy, &m.Loss, &m.N
	}
}

type localFlags struct {
	config       string
	dataDir      string
	nodes        int
	insecureSeed uint64
	progress     string
	logFormat    string
	metricsAddr  string
	device       string
	json         bool
	tlsCA        string
	tlsCert      string
	tlsKey       string
	hooks        LocalHooks
	// budget: the training set's lifetime budget flags.
	budget budgetOptions
	// nodeConfig, if not nil, amends node i's configuration before its
	// Worker is built: audit-privacy's canaries (auditprivacy.go), set
	// by no other command.
	nodeConfig func(i int, c *node.Config)
}

func newLocalCmd() *cobra.Command { return newLocalCmdHooks(LocalHooks{}) }

// newLocalCmdHooks is the local command whose run reports to hooks.
func newLocalCmdHooks(hooks LocalHooks) *cobra.Command {
	spec := defaultRunSpec()
	f := localFlags{nodes: 3, progress: "auto", logFormat: "text", dataDir: "", device: "cpu", hooks: hooks}
	cmd := &cobra.Command{
		Use:   "local",
		Short: "Train in one process: embedded NATS, one coordinator replica, k in-process nodes",
		Long: `local runs a whole dpcluster training run on one machine: an embedded NATS server, one
Raft coordinator replica with its durable log and privacy ledger under --data-dir, and --nodes
worker nodes, each holding one IID shard of the training set. By default it trains the mlp
preset on Fashion-MNIST with DP-AdamBC to ε = 3 (δ = 1e-5), σ calibrated for --max-steps.

Re-running with the same --data-dir resumes the run where it stopped (the configuration must
be the same); audit the ledger with: coordinator ledger audit DIR. --device cuda:N computes every
node's clipped sums on one NVIDIA GPU, in a binary built with -tags cuda (docs/GPU.md).

The embedded NATS server listens on a free loopback port (logged at start). With --tls-ca,
--tls-cert and --tls-key (a replica certificate) it requires mutual TLS and gives every
certificate its role's permissions, as coordinator serve's does; the in-process replica and nodes
present that certificate, other processes (coordinator status) their own.`,
		Example: `  coordinator local --max-steps 1000 --data-dir /tmp/run1
  coordinator local --config run.yaml --nodes 4 --target-epsilon 1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadRunSpec(&spec, f.config, cmd.Flags()); err != nil {
				return err
			}
			if !cmd.Flags().Changed("data-dir") {
				// One directory per run, so that two runs on different
				// data never meet in one log.
				f.dataDir = filepath.Join("dpcluster-data", spec.Run)
			}
			return runLocal(cmd, spec, f)
		},
	}
	fs := cmd.Flags()
	spec.bind(fs)
	fs.StringVar(&f.config, "config", "", "YAML run file; flags override it")
	fs.StringVar(&f.dataDir, "data-dir", f.dataDir, "directory for the replica's Raft log, snapshots and privacy ledger (default: dpcluster-data/RUN, RUN the run's name)")
	fs.IntVar(&f.nodes, "nodes", f.nodes, "number of in-process nodes (the training set is split IID among them)")
	fs.Uint64Var(&f.insecureSeed, "insecure-seed", 0, "if non-zero, seed noise and sampling: reproducible and NOT private")
	fs.StringVar(&f.progress, "progress", f.progress, "progress bar: auto (on a terminal), on or off")
	fs.StringVar(&f.logFormat, "log-format", f.logFormat, "log format: text or json")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address (empty: off)")
	fs.StringVar(&f.device, "device", f.device, deviceFlagUsage)
	fs.BoolVar(&f.json, "json", false, "print the result as JSON")
	f.budget.bind(fs)
	bindTLSFlags(fs, &f.tlsCA, &f.tlsCert, &f.tlsKey, "a replica certificate for the embedded NATS server")
	return cmd
}

// localRaftTimeout is local's Raft heartbeat, election and leader lease
// timeout (one voter).
const localRaftTimeout = 50 * time.Millisecond

func runLocal(cmd *cobra.Command, spec runSpec, f localFlags) error {
	if f.nodes < 1 {
		return fmt.Errorf("--nodes %d must be at least 1", f.nodes)
	}
	if f.dataDir == "" {
		return errors.New("--data-dir must not be empty")
	}
	if spec.Dataset == "none" {
		return errors.New("local needs a dataset to shard among its nodes")
	}
	if len(spec.Nodes) > 0 && len(spec.Nodes) != f.nodes {
		return fmt.Errorf("--nodes %d: the run names %d nodes (--node-ids %q); local runs one node per name", f.nodes, len(spec.Nodes), spec.Nodes)
	}
	if spec.Dataset == dataset.NameLocal {
		return errors.New("--dataset local is for nodes that each bring their own file (coordinator serve and node processes: docs/DATA.md); " +
			"local cuts one training set among its in-process nodes: give --data-path FILE")
	}
	natsTLS, err := tlsFiles(f.tlsCA, f.tlsCert, f.tlsKey)
	if err != nil {
		return err
	}
	log, err := newLogger(cmd, f.logFormat, slog.LevelInfo)
	if err != nil {
		return err
	}
	// Opened first, closed last: every node's engine is released when its
	// Run returns, and runLocal waits for all of them below.
	dev := f.hooks.Device
	if dev == nil {
		if dev, err = openDevice(f.device, log); err != nil {
			return err
		}
		defer closeDevice(dev, log)
	} else {
		log.Info("compute device (set by the caller)", deviceAttrs(dev.Info())...)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	gc := startGCTuner(log, gcTunePeriod)
	defer gc.Stop()
	started := time.Now()
	seeded := f.insecureSeed != 0
	if err := checkDataDirFree(f.dataDir); err != nil {
		return err
	}
	if err := f.budget.check(); err != nil {
		return err
	}
	if err := checkResumeAdmission(f.budget, f.dataDir); err != nil {
		return err
	}
	if err := checkMetricsAddr(f.metricsAddr); err != nil {
		return err
	}
	spec.keepLegacyNoise(f.dataDir, log)
	spec.keepLegacyAccountant(f.dataDir, log)
	spec.keepLedgerDelta(f.dataDir)
	pr, err := spec.prepare(ctx, seeded, f.dataDir, log)
	if err != nil {
		return err
	}
	if err := spec.checkPlannedBudget(pr.cfg); err != nil {
		return err
	}
	var srv *openedServer // set once the replica is open
	if f.budget.dir != "" {
		adm, err := admitToDataset(f.budget, pr.train, spec.datasetLabel(), &pr.cfg, f.dataDir, log)
		if err != nil {
			return err
		}
		defer func() { adm.settle(srv.configured(), log) }() // after the replica has stopped charging
	}
	rc := pr.cfg
	raftAddr, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	// The first and the last step's release times, for the result's
	// Timing (the hook runs on the server's loop, Run returns after it).
	var firstStep, lastStep time.Time
	onStep := func(p coordinator.Progress) {
		if stepTrained(p) {
			now := time.Now()
			if firstStep.IsZero() {
				firstStep = now
			}
			lastStep = now
		}
		if f.hooks.OnStep != nil {
			f.hooks.OnStep(p)
		}
	}
	opts := serverOptions{nats: transport.DefaultConfig(), metricsAddr: f.metricsAddr, progress: f.progress, insecureSeed: f.insecureSeed,
		registry: f.hooks.Registry, onStep: onStep}
	opts.nats.Embedded.Port = -1 // any free port: nodes are in-process
	opts.nats.Embedded.TLS = natsTLS
	opts.replica = coordinator.DefaultReplicaConfig()
	opts.replica.ID, opts.replica.RaftAddr, opts.replica.DataDir, opts.replica.Bootstrap = "local", raftAddr, f.dataDir, true
	// The only voter: it has no leader to wait for and no follower to
	// lose, so it elects itself after 50 ms instead of the default 500
	// (time to the first step).
	opts.replica.HeartbeatTimeout, opts.replica.ElectionTimeout, opts.replica.LeaderLeaseTimeout = localRaftTimeout, localRaftTimeout, localRaftTimeout
	if !cmd.Flags().Changed("min-nodes") {
		opts.minNodes = f.nodes // wait for every in-process node
	}
	srv, err = openServer(ctx, cmd, spec, pr, opts, log)
	if err != nil {
		return err
	}
	defer srv.close()
	log.Info("embedded NATS server", "url", srv.conn.ServerURL(), "tls", natsTLS.CertFile != "")

	nodeCtx, stopNodes := context.WithCancel(ctx)
	defer stopNodes()
	nodeErrs, err := startLocalNodes(nodeCtx, srv.conn.ServerURL(), natsTLS, rc, pr.model, pr.train, spec.ShardSeed, f, dev, srv.registry, quietLogger(log))
	if err != nil {
		return err
	}
	// A node the coordinator refuses (its data is not what the run
	// trained it on, say) ends the run: the rounds would wait for it
	// forever. Its error is the command's.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var refused error
	nodeDone := make(chan error, f.nodes)
	go func() {
		for range f.nodes {
			err := <-nodeErrs
			if errors.Is(err, node.ErrRefused) || errors.Is(err, node.ErrModelMismatch) {
				refused = cmp.Or(refused, err)
				stopRun()
			}
			nodeDone <- err
		}
	}()
	sum, runErr := srv.server.Run(runCtx)
	srv.progress.finish()
	// Nodes stop on the Done status; give them a moment, then cancel.
	wait := time.AfterFunc(3*time.Second, stopNodes)
	for range f.nodes {
		if err := <-nodeDone; err != nil && !errors.Is(err, context.Canceled) && runErr == nil {
			log.Warn("node stopped with an error", "err", err)
		}
	}
	wait.Stop()
	if refused != nil { // written before the last nodeDone send: read after it
		return refused
	}
	if runErr != nil && !interrupted(ctx, runErr) {
		return runErr
	}
	// The replica's state machine holds θ at the last committed step:
	// export it from there (coordinator export reads the same from the
	// data dir by replaying the log, which takes about as long as a
	// tenth of the run's steps), also for an interrupted run.
	modelPath := filepath.Join(f.dataDir, ModelFile)
	committed, err := srv.replica.FSM().Committed()
	if err != nil && !errors.Is(err, coordinator.ErrNotConfigured) {
		return err
	}
	var finetuned string // the checkpoint-format folder of a fine-tuned run
	if err == nil {
		theta := committed.Theta
		var fm *model.Model
		if committed, fm, err = mergeFrozen(committed, "", pr.model); err != nil {
			return err
		}
		if err := writeModel(committed, modelPath); err != nil {
			return err
		}
		if finetuned, err = writeFinetuned(committed, f.dataDir); err != nil {
			return err
		}
		if finetuned != "" {
			if err := writeAdapters(committed, fm, theta, finetuned); err != nil {
				return err
			}
		}
	}
	if interrupted(ctx, runErr) {
		// The line reports the state the model file holds, read once: an
		// entry proposed before the interruption may still have been
		// applied after Run's summary (settle waits for it at most
		// settleTimeout).
		steps, eps, charged := sum.Steps, sum.Epsilon, sum.Charged
		if err == nil {
			steps, eps, charged = committed.Step, committed.Epsilon, committed.Charged
		}
		if charged > steps {
			// The interruption fell between step charged's charge and its
			// update: charged (its release may be out), not applied.
			fmt.Fprintf(cmd.OutOrStdout(), "interrupted after %d steps (ε = %.4f, charged through step %d); run the same command to resume\n",
				steps, eps, charged)
		} else {
			fmt.Fprintf(cmd.OutOrStdout(), "interrupted after %d steps (ε = %.4f); run the same command to resume\n", steps, eps)
		}
		if committed.Step > 0 {
			fmt.Fprintf(cmd.OutOrStdout(), "model: %s (θ at step %d, safetensors)\n", modelPath, committed.Step)
			if finetuned != "" {
				fmt.Fprintln(cmd.OutOrStdout(), finetunedLine(finetuned, committed.Step))
			}
		}
		return nil
	}

	finished := time.Now()
	res := localResult{
		Run: rc.Run, Steps: sum.Steps, ChargedStep: sum.Charged, Epsilon: sum.Epsilon, Delta: sum.Delta, TargetEpsilon: rc.TargetEpsilon,
		Sigma: rc.Optimizer.NoiseMultiplier, SampleRate: rc.SampleRate, NoiseMode: rc.NoiseMode, Stopped: sum.Stopped,
		Accountant: accountantName(rc.Accountant),
		EvalData:   evalLabel(pr.eval),
		Ledger:     filepath.Join(f.dataDir, coordinator.LedgerFile), Seconds: finished.Sub(started).Seconds(),
		Private: !seeded, Model: modelPath, Finetuned: finetuned, StateSHA256: sum.Digest,
	}
	res.setFinalEval(sum)
	if !firstStep.IsZero() {
		res.Timing.ToFirstStep = firstStep.Sub(started).Seconds()
		res.Timing.Stepping = lastStep.Sub(firstStep).Seconds()
		res.Timing.AfterLastStep = finished.Sub(lastStep).Seconds()
	}
	out := cmd.OutOrStdout()
	if f.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if firstStep.IsZero() && res.Steps > 0 {
		// Nothing was trained here: the data dir holds a finished run.
		fmt.Fprintf(out, "run %s is already finished: %d steps (%s); nothing was trained. A run's budget is spent once: "+
			"to train more, start a new run with its own budget in another --data-dir (and another --run)\n",
			rc.Run, res.Steps, res.Stopped)
	} else {
		fmt.Fprintf(out, "trained %s for %d steps (%s) in %.0fs (%.1fs to the first step, %.1fs stepping, %.1fs after the last)\n",
			rc.Run, res.Steps, res.Stopped, res.Seconds, res.Timing.ToFirstStep, res.Timing.Stepping, res.Timing.AfterLastStep)
	}
	if line := divergedWarning(res.Stopped); line != "" {
		fmt.Fprintln(out, line)
	}
	if line := evalSummary(pr.eval, sum); line != "" {
		fmt.Fprintln(out, line)
	}
	fmt.Fprintf(out, "ε = %.4f at δ = %g%s (target ε = %g, %s accountant; σ = %.4f, q = %.6g, noise %s)\n", res.Epsilon, res.Delta,
		unappliedCharge(res.Steps, res.ChargedStep), res.TargetEpsilon, res.Accountant, res.Sigma, res.SampleRate, noiseModeName(res.NoiseMode))
	if !res.Private {
		fmt.Fprintln(out, "WARNING: seeded noise (--insecure-seed): this run is NOT differentially private")
	}
	fmt.Fprintf(out, "ledger: %s (check it: coordinator ledger audit %s)\n", res.Ledger, f.dataDir)
	fmt.Fprintf(out, "model: %s (θ at step %d, safetensors)\n", res.Model, res.Steps)
	if res.Finetuned != "" {
		fmt.Fprintln(out, finetunedLine(res.Finetuned, res.Steps))
	}
	return nil
}

// divergedWarning is the line local and serve print when the leader
// stopped the run because its evaluation loss diverged
// (coordinator.StopDiverged), else "".
func divergedWarning(stopped string) string {
	if !strings.HasPrefix(stopped, coordinator.StopDiverged) {
		return ""
	}
	return "WARNING: " + stopped + "; the ledger holds what was spent. The run is finished: to train, " +
		"start a new run (another --data-dir), e.g. with a lower --lr"
}

// unappliedCharge is what a line reporting ε after steps applied steps
// adds when ε runs through a later step, charged: "" when charged is not
// past steps, else a note that ε counts step charged, never applied.
func unappliedCharge(steps, charged int64) string {
	if charged <= steps {
		return ""
	}
	return fmt.Sprintf(", through step %d (charged, never applied)", charged)
}

// startLocalNodes starts one node.Worker per IID shard of trainSet (a
// view: the nodes share trainSet read-only, dataset.ShardViewsIID), each
// with its own NATS connection to url (over TLS with files, if set: the
// embedded server's own certificate), the run's q and C from rc (the
// replica's own configuration) and an engine on dev. Every worker is built
// (and its engine allocated) before any starts, so a device that cannot
// run the model, or lacks the memory for all the nodes, is an error here
// with nothing left running. Each worker's result arrives on the returned
// channel once its Run has returned and its engine is released.
func startLocalNodes(ctx context.Context, url string, files transport.TLSConfig, rc coordinator.RunConfig, m *model.Model, trainSet *dataset.Dataset, shardSeed uint64, f localFlags, dev model.Device, reg prometheus.Registerer, log *slog.Logger) (_ <-chan error, err error) {
	run := rc.Run
	shards, err := dataset.ShardViewsIID(trainSet, f.nodes, shardSeed)
	if err != nil {
		return nil, err
	}
	type built struct {
		w    *node.Worker
		conn *transport.Client
	}
	var nodes []built
	defer func() {
		if err == nil {
			return
		}
		for _, n := range nodes {
			if cerr := n.w.Close(); cerr != nil {
				log.Warn("closing a node's engine", "err", cerr)
			}
			n.conn.Close()
		}
	}()
	for i, shard := range shards {
		id := fmt.Sprintf("node-%d", i)
		if len(rc.Nodes) == len(shards) {
			id = rc.Nodes[i] // the run file's IDs, each bound to its shard
		}
		tcfg := transport.DefaultConfig()
		tcfg.Run, tcfg.URLs, tcfg.TLS = run, []string{url}, files
		if files.CertFile == "" {
			tcfg.Role, tcfg.Name = pki.RoleNode, id
		}
		conn, err := transport.Connect(ctx, tcfg, log)
		if err != nil {
			return nil, err
		}
		ncfg := node.DefaultConfig()
		ncfg.ID, ncfg.Run, ncfg.Registerer = id, run, reg
		ncfg.SampleRate, ncfg.ClipNorm = rc.SampleRate, rc.Optimizer.ClipNorm
		ncfg.ShardIndex, ncfg.ShardCount, ncfg.ShardSeed = i, f.nodes, shardSeed
		ncfg.Device = dev
		// The run binds each node ID to its shard's content: a resume on
		// another data file of the same shape is refused, naming both.
		ncfg.DataHash = shard.Data.Subset(shard.Rows).ContentHash()
		if rc.Pretrained != nil {
			ncfg.Weights = rc.Pretrained.WeightsSHA256
		}
		if f.nodeConfig != nil {
			f.nodeConfig(i, &ncfg)
		}
		if f.insecureSeed != 0 {
			ncfg.SeededSampling, ncfg.SamplingSeed = true, f.insecureSeed+uint64(i)+1
		}
		w, err := node.NewWorkerView(ncfg, m, shard, conn, log)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		nodes = append(nodes, built{w, conn})
	}
	errs := make(chan error, f.nodes)
	for _, n := range nodes {
		go func() {
			err := n.w.Run(ctx)
			n.conn.Close()
			errs <- err
		}()
	}
	return errs, nil
}

// quietLogger passes only warnings and errors to log's handler.
func quietLogger(log *slog.Logger) *slog.Logger {
	return slog.New(levelHandler{min: slog.LevelWarn, Handler: log.Handler()})
}

type levelHandler struct {
	min slog.Level
	slog.Handler
}

func (h levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return levelHandler{h.min, h.Handler.WithAttrs(a)}
}

func (h levelHandler) WithGroup(n string) slog.Handler {
	return levelHandler{h.min, h.Handler.WithGroup(n)}
}

// freeLoopbackAddr returns 127.0.0.1 with a port free right now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

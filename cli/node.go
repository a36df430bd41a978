package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/node"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
)

// loadModel is model.Load with the flag that named the model in its
// errors.
func loadModel(preset, specFile string) (*model.Model, error) {
	m, err := model.Load(preset, specFile)
	switch {
	case err == nil:
		return m, nil
	case specFile != "":
		return nil, fmt.Errorf("--model-spec: %w", err)
	}
	return nil, fmt.Errorf("--model: %w", err)
}

// nodeFlags are the node command's own flags; the run is a runSpec read
// from --config and the run flags, as on the replicas.
type nodeFlags struct {
	config              string
	id, nats            string
	shardIndex          int
	shardCount          int
	heartbeat           time.Duration
	coordinatorTimeout  time.Duration
	metricsAddr         string
	insecureSeed        uint64
	device              string
	logFormat, logLevel string
	insecure            bool
	tlsCA, tlsCert      string
	tlsKey              string
}

// defaultNodeID is hostname-pid (the short host name), with any other
// character a node ID does not allow replaced by '-'.
func defaultNodeID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "node"
	}
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	id := []byte(fmt.Sprintf("%s-%d", host, os.Getpid()))
	for i, c := range id {
		if !node.ValidID(string(c)) {
			id[i] = '-'
		}
	}
	if len(id) > 64 {
		id = id[len(id)-64:]
	}
	return string(id)
}

// NewNodeCmd returns the root command of the node binary: a dpcluster
// worker that reads the run file, dials the run's NATS servers, loads its
// shard and answers the coordinator's rounds until the run ends or it
// receives SIGINT or SIGTERM (then it sends Leave and exits 0).
func NewNodeCmd() *cobra.Command {
	spec := defaultRunSpec()
	f := nodeFlags{id: defaultNodeID(), shardCount: 1, heartbeat: time.Second, coordinatorTimeout: node.DefaultConfig().CoordinatorTimeout,
		device: "cpu", logFormat: "text", logLevel: "info"}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "dpcluster node: computes clipped gradient sums on a private data shard",
		Long: `A dpcluster worker. It reads the run file the coordinator replicas use (--config, required;
the run flags override it as they do on the replicas), dials the coordinator's NATS servers (it
never embeds one), loads its shard of the training data, and each round Poisson-samples the
shard, computes the sum of per-example gradients clipped to norm C and sends it to the leader.
It derives the sampling rate q = B/N and C from the run file exactly as the replicas do, and
refuses any round that names another q, C or model. Sums and counts are private: they are never
logged, exported or stored. All nodes of a run use the same run file and --shard-count, each its
own --shard-index; the leader opens no round while two live nodes claim the same shard.
--device cuda:N computes on an NVIDIA GPU, in a node binary built with -tags cuda (docs/GPU.md).
With --tls-ca, --tls-cert and --tls-key the node dials NATS over mutual TLS, presenting its node
certificate (whose ID must be --id), and accepts only servers holding a replica certificate of
the CA for the host it dials (docs/SECURITY.md).
A node refuses to dial a NATS server off the loopback interface without --tls-ca, --tls-cert and
--tls-key; --insecure allows it, unprotected, and every log line then says transport=INSECURE.
Every flag can also be given as an environment variable, DPC_ and the flag's name in capitals
with - as _ (--label-column: DPC_LABEL_COLUMN; an empty value is a value): the command line wins
over the environment, which wins over the run file.`,
		Example: `  node --config run.yaml --nats nats://coord-1:4222,nats://coord-2:4222 \
      --shard-index 0 --shard-count 4
  node --config run.yaml --nats tls://coord-1:4222,tls://coord-2:4222 --id node-0 \
      --shard-index 0 --shard-count 4 --tls-ca certs/ca.crt --tls-cert certs/node-0.crt --tls-key certs/node-0.key`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			urls, err := settleNode(cmd.Flags(), &spec, &f, os.Environ())
			if err != nil {
				return err
			}
			return runNode(cmd, spec, &f, urls)
		},
	}
	bindNodeFlags(cmd.Flags(), &spec, &f)
	return cmd
}

// settleNode works out the node's settings from its flags fs (parsed),
// the environment (DPC_ variables, applyEnv) and the run file, in that
// order of precedence, and checks them: the NATS URLs, then spec and f
// as the node runs with them.
func settleNode(fs *pflag.FlagSet, spec *runSpec, f *nodeFlags, environ []string) ([]string, error) {
	if err := applyEnv(fs, environ); err != nil {
		return nil, err
	}
	urls, err := f.validate()
	if err != nil {
		return nil, err
	}
	if err := loadRunSpec(spec, f.config, fs); err != nil {
		return nil, err
	}
	if err := f.shardFromNodes(*spec, fs); err != nil {
		return nil, err
	}
	return urls, nil
}

// bindNodeFlags registers the node command's flags on fl: the run flags
// (runSpec.bind) and the node's own.
func bindNodeFlags(fl *pflag.FlagSet, spec *runSpec, f *nodeFlags) {
	spec.bind(fl)
	fl.StringVar(&f.config, "config", "", "the run file the coordinator replicas use (required); run flags override it")
	fl.StringVar(&f.id, "id", f.id, "node ID, unique in the run (1-64 of [A-Za-z0-9_-])")
	fl.StringVar(&f.nats, "nats", "", "NATS server URLs, comma-separated (required)")
	fl.IntVar(&f.shardIndex, "shard-index", 0, "this node's shard, in [0, --shard-count)")
	fl.IntVar(&f.shardCount, "shard-count", f.shardCount, "number of shards the training set is cut into (with the run's shard_seed)")
	fl.DurationVar(&f.heartbeat, "heartbeat", f.heartbeat, "heartbeat period")
	fl.DurationVar(&f.coordinatorTimeout, "coordinator-timeout", f.coordinatorTimeout,
		"exit (non-zero) when no coordinator replica was heard for this long after one was: the run ended or its replicas are gone (0: wait forever)")
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on host:port/metrics (empty: off)")
	fl.Uint64Var(&f.insecureSeed, "insecure-seed", 0, "TESTS ONLY: seed the batch sampling; the node is then NOT private")
	fl.StringVar(&f.device, "device", f.device, deviceFlagUsage)
	fl.StringVar(&f.logFormat, "log-format", f.logFormat, "log format: text|json")
	fl.StringVar(&f.logLevel, "log-level", f.logLevel, "log level: debug|info|warn|error")
	bindTLSFlags(fl, &f.tlsCA, &f.tlsCert, &f.tlsKey, "this node's certificate (a node certificate for --id)")
	fl.BoolVar(&f.insecure, "insecure", false, insecureFlagUsage)
}

// nodeLogger builds the command's logger on w.
func nodeLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level must be debug, info, warn or error, not %q", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}

// shardFromNodes takes the node's shard from the run's node list, if it
// has one: node nodes[i] holds shard i of len(nodes). A --shard-index or
// --shard-count that says otherwise is an error, and so is an --id the
// list does not name (the leader would refuse it).
func (f *nodeFlags) shardFromNodes(spec runSpec, fs *pflag.FlagSet) error {
	if len(spec.Nodes) == 0 || spec.Dataset == dataset.NameLocal {
		if len(spec.Nodes) > 0 && !slices.Contains(spec.Nodes, f.id) {
			return fmt.Errorf("--id %s is not one of the run's nodes %q", f.id, spec.Nodes)
		}
		return nil
	}
	i := slices.Index(spec.Nodes, f.id)
	if i < 0 {
		return fmt.Errorf("--id %s is not one of the run's nodes %q: the run file binds each node ID to its shard", f.id, spec.Nodes)
	}
	if fs.Changed("shard-index") && f.shardIndex != i || fs.Changed("shard-count") && f.shardCount != len(spec.Nodes) {
		return fmt.Errorf("--shard-index %d --shard-count %d: the run's node list gives %s shard %d of %d", f.shardIndex, f.shardCount, f.id, i, len(spec.Nodes))
	}
	f.shardIndex, f.shardCount = i, len(spec.Nodes)
	return nil
}

// validate checks the node's own flags (no I/O).
func (f *nodeFlags) validate() (urls []string, err error) {
	for _, u := range strings.Split(f.nats, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return nil, errors.New("--nats is required: the URLs of the run's NATS servers (a node never embeds a server)")
	}
	if f.config == "" {
		return nil, errors.New("--config is required: the run file the coordinator replicas use; the node derives the " +
			"sampling rate q and clip norm C from it as they do, and refuses rounds that name others")
	}
	if !node.ValidID(f.id) {
		return nil, fmt.Errorf("--id %q must be 1-64 of [A-Za-z0-9_-]", f.id)
	}
	if f.shardCount < 1 {
		return nil, fmt.Errorf("--shard-count %d must be ≥ 1", f.shardCount)
	}
	if f.shardIndex < 0 || f.shardIndex >= f.shardCount {
		return nil, fmt.Errorf("--shard-index %d out of range: must be in [0, %d) for --shard-count %d", f.shardIndex, f.shardCount, f.shardCount)
	}
	if f.heartbeat <= 0 {
		return nil, fmt.Errorf("--heartbeat %v must be > 0", f.heartbeat)
	}
	if f.coordinatorTimeout < 0 {
		return nil, fmt.Errorf("--coordinator-timeout %v must be ≥ 0 (0: wait forever)", f.coordinatorTimeout)
	}
	if _, err := tlsFiles(f.tlsCA, f.tlsCert, f.tlsKey); err != nil {
		return nil, err
	}
	return urls, nil
}

// loadNodeShard prepares the run as the replicas do (spec.prepare: the model,
// the training set they count as N, the run configuration, less σ) and returns
// shard index of count (dataset.ShardIID with the run's shard seed), a copy
// of its rows only: the whole training set is dropped (pr.train is nil), so
// the node holds its shard, not the data of every node. The
// run's seed policy (the replicas' noise) is not the node's to say: the
// node reports its own sampling in Join. A node does not evaluate, so it
// never reads the coordinator's --eval-path; an --eval-split-from-train
// still cuts the same training set.
func loadNodeShard(ctx context.Context, spec runSpec, index, count int, log *slog.Logger) (preparedRun, *dataset.Dataset, error) {
	spec.EvalPath = ""
	// A node takes N, q, C and the run's name from the configuration,
	// never σ: the noise is the leader's (coordinator.RunPlan.NodeConfig).
	spec.forNode = true
	pr, err := spec.prepare(ctx, false, "", log)
	if err != nil {
		return pr, nil, err
	}
	if spec.Dataset == dataset.NameLocal {
		// The node's own data, checked against the run's schema: the
		// replicas loaded none, and there is nothing to cut.
		sc, err := spec.schema()
		if err != nil {
			return pr, nil, err
		}
		own, err := spec.readLocal(spec.DataPath, sc)
		if err != nil {
			return pr, nil, fmt.Errorf("--data-path: %w", err)
		}
		return pr, own, nil
	}
	views, err := dataset.ShardViewsIID(pr.train, count, spec.ShardSeed)
	if err != nil {
		return pr, nil, err
	}
	if index < 0 || index >= count {
		return pr, nil, fmt.Errorf("shard index %d outside [0, %d)", index, count)
	}
	v := views[index]
	shard := v.Data.Subset(v.Rows)
	shard.Name = v.Name
	pr.train = nil
	return pr, shard, nil
}

// runNode runs the node of the run spec describes. The model, the data and
// the run configuration come from spec.prepare, the replicas' own path, so
// the node's q and C are the replicas' bit for bit; its shard is part
// f.shardIndex of the training set cut into f.shardCount IID parts with the
// run's shard seed. The compute device (--device) is opened first, so that
// a device this binary cannot use fails before any data is loaded, and the
// worker's engine is allocated on it before the node joins the run; the
// device is closed on the way out, after the worker released its engine.
func runNode(cmd *cobra.Command, spec runSpec, f *nodeFlags, urls []string) error {
	if !transport.ValidRunName(spec.Run) {
		return fmt.Errorf("--run %q must be 1-64 of [A-Za-z0-9_-]", spec.Run)
	}
	if spec.Dataset == "none" {
		return errors.New("a node needs the training data: dataset none is for coordinator serve only")
	}
	local := spec.Dataset == dataset.NameLocal
	if local && spec.DataPath == "" {
		return errors.New("--dataset local: each node brings its own data: give this node's file with --data-path FILE")
	}
	if local && (cmd.Flags().Changed("shard-index") || cmd.Flags().Changed("shard-count")) {
		return errors.New("--shard-index and --shard-count cut one shared training set; with --dataset local this node trains on its own --data-path")
	}
	log, err := nodeLogger(stderr(cmd), f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	if log, err = guardTransport(log, endpoints("--nats", urls...), tlsFlagsGiven(cmd.Flags()), f.insecure); err != nil {
		return err
	}
	dev, err := openDevice(f.device, log)
	if err != nil {
		return err
	}
	defer closeDevice(dev, log)
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	gc := startGCTuner(log, gcTunePeriod)
	defer gc.Stop()

	pr, shard, err := loadNodeShard(ctx, spec, f.shardIndex, f.shardCount, log)
	if err != nil {
		return err
	}
	m, rc := pr.model, pr.cfg
	cfg := node.DefaultConfig()
	cfg.ID, cfg.Run, cfg.HeartbeatEvery, cfg.CoordinatorTimeout = f.id, rc.Run, f.heartbeat, f.coordinatorTimeout
	cfg.SampleRate, cfg.ClipNorm = rc.SampleRate, rc.Optimizer.ClipNorm
	if rc.Pretrained != nil {
		// The checkpoint this node's model was built from (--init-from).
		cfg.Weights = rc.Pretrained.WeightsSHA256
	}
	if local {
		cfg.DataSchema = dataset.SchemaOf(shard).String()
		log.Info("own data loaded", "run", rc.Run, "data_path", spec.DataPath, "examples", shard.Len(),
			"data_schema", cfg.DataSchema, "total_examples", rc.TotalExamples, "q", rc.SampleRate,
			"clip", rc.Optimizer.ClipNorm, "model", m.Spec().Name, "model_hash", m.Hash(), "params", m.NumParams(),
			"backend", m.Backend().Name())
	} else {
		cfg.ShardIndex, cfg.ShardCount, cfg.ShardSeed = f.shardIndex, f.shardCount, spec.ShardSeed
		log.Info("shard loaded", "run", rc.Run, "dataset", spec.Dataset, "shard", fmt.Sprintf("%d/%d", f.shardIndex, f.shardCount),
			"shard_seed", spec.ShardSeed, "examples", shard.Len(), "total_examples", rc.TotalExamples, "q", rc.SampleRate,
			"clip", rc.Optimizer.ClipNorm, "model", m.Spec().Name, "model_hash", m.Hash(), "params", m.NumParams(),
			"backend", m.Backend().Name())
	}
	// The run binds this node's ID to its data's content: a restart on
	// other data of the same shape is refused, not trained on silently.
	cfg.DataHash = shard.ContentHash()
	cfg.Device = dev
	if cmd.Flags().Changed("insecure-seed") {
		log.Warn("INSECURE: --insecure-seed set; batch sampling is predictable and this node is NOT differentially private",
			"seed", f.insecureSeed)
		cfg.SeededSampling, cfg.SamplingSeed = true, f.insecureSeed
	}

	// The metrics server lives as long as this command.
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var metricsDone <-chan error
	if f.metricsAddr != "" {
		reg := newRegistry()
		cfg.Registerer = reg
		if _, metricsDone, err = serveMetrics(runCtx, f.metricsAddr, reg, nil, log); err != nil {
			return err
		}
		defer func() {
			cancelRun()
			<-metricsDone
		}()
	}

	tcfg := transport.DefaultConfig()
	tcfg.URLs = urls
	tcfg.Run = rc.Run
	tcfg.Role, tcfg.Name = pki.RoleNode, f.id // with TLS, the certificate must say so
	if tcfg.TLS, err = tlsFiles(f.tlsCA, f.tlsCert, f.tlsKey); err != nil {
		return err
	}
	tcfg.RetryConnect = true // a node may start before its NATS servers
	conn, err := transport.Connect(ctx, tcfg, log)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", f.nats, err)
	}
	defer conn.Close()

	w, err := node.NewWorker(cfg, m, shard, conn, log)
	if err != nil {
		return err
	}
	err = w.Run(ctx)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		log.Info("node: interrupted; left the run")
		return nil
	}
	return err
}

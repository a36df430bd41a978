package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/coordinator/dashboard"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/raftnet"
	"github.com/dpcluster/dpcluster/transport"
)

type serveFlags struct {
	config       string
	id           string
	raftAddr     string
	dataDir      string
	bootstrap    bool
	join         bool
	peers        string
	raftDial     string
	nats         string
	natsListen   string
	natsCluster  string
	natsRoutes   string
	natsAdv      string
	clusterAdv   string
	insecureSeed uint64
	progress     string
	logFormat    string
	metricsAddr  string
	tlsCA        string
	tlsCert      string
	tlsKey       string
	insecure     bool
}

func newServeCmd() *cobra.Command {
	spec := defaultRunSpec()
	f := serveFlags{id: "r1", raftAddr: "127.0.0.1:7000", progress: "off", logFormat: "text", natsListen: "127.0.0.1:4222"}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run one coordinator replica (Raft) of a training run",
		Long: `serve runs one coordinator replica: Raft over TCP at --raft-addr with its log, snapshots and
privacy ledger under --data-dir, and the round loop, which runs while this replica leads. It
talks to nodes through NATS: the servers in --nats, or, when --nats is empty, a NATS server it
embeds on --nats-listen.

serve refuses to listen on or dial an address off the loopback interface (--raft-addr, --peers,
--nats, --nats-listen, --nats-cluster, --nats-routes) without --tls-ca, --tls-cert and --tls-key.
--insecure allows it without TLS, unprotected: every log line then says transport=INSECURE and
coordinator status shows the replica as NOT protected.

The run is defined by --config and the run flags, identically on every replica. With a dataset
the replica reads N from it and evaluates θ on its test split; with --dataset none give
--total-examples. serve exits 0 when the run has finished (max steps or budget).

With --tls-ca, --tls-cert and --tls-key (from coordinator certs init; a replica certificate for
--id) Raft runs over mutual TLS and accepts only replica certificates of that CA, and NATS runs
over mutual TLS too: the embedded server (and its routes to --nats-routes) requires a certificate
of the CA from every client and gives each the permissions of its role, or, with --nats, this
replica presents its certificate to those servers (docs/SECURITY.md).`,
		Example: `  coordinator serve --id r1 --raft-addr 127.0.0.1:7000 --data-dir /var/lib/dpc/r1 --bootstrap \
      --nats nats://127.0.0.1:4222 --config run.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadRunSpec(&spec, f.config, cmd.Flags()); err != nil {
				return err
			}
			if err := spec.checkOwnDataMinNodes(); err != nil {
				return err
			}
			return runServe(cmd, spec, f)
		},
	}
	fs := cmd.Flags()
	spec.bind(fs)
	fs.StringVar(&f.config, "config", "", "YAML run file; flags override it")
	fs.StringVar(&f.id, "id", f.id, "replica ID, unique in the cluster")
	fs.StringVar(&f.raftAddr, "raft-addr", f.raftAddr, "TCP address Raft binds and advertises (host:port)")
	fs.StringVar(&f.dataDir, "data-dir", "", "directory for the Raft log, snapshots and the privacy ledger (required)")
	fs.BoolVar(&f.bootstrap, "bootstrap", false, "bootstrap a new cluster (a no-op on a data dir with state)")
	fs.BoolVar(&f.join, "join", false, "ask the cluster's leader, over NATS, to add this replica as a voter")
	fs.StringVar(&f.peers, "peers", "", "initial voters when bootstrapping, id=host:port,... (default: this replica alone)")
	fs.StringVar(&f.raftDial, "raft-dial", "", "dial these peers at these addresses instead of their Raft addresses, id=host:port,... (a proxy in between)")
	fs.StringVar(&f.nats, "nats", "", "NATS server URLs, comma-separated (empty: embed a server on --nats-listen)")
	fs.StringVar(&f.natsListen, "nats-listen", f.natsListen, "address of the embedded NATS server when --nats is empty")
	fs.StringVar(&f.natsCluster, "nats-cluster", "", "make the embedded NATS server a cluster member accepting routes on host:port")
	fs.StringVar(&f.natsRoutes, "nats-routes", "", "the other members' route URLs, comma-separated (nats-route://host:port)")
	fs.StringVar(&f.natsAdv, "nats-advertise", "", "client address the embedded NATS server tells clients to use instead of --nats-listen (a proxy in front)")
	fs.StringVar(&f.clusterAdv, "nats-cluster-advertise", "", "route address the embedded NATS server tells the other members instead of --nats-cluster")
	fs.Uint64Var(&f.insecureSeed, "insecure-seed", 0, "if non-zero, seed the noise: reproducible and NOT private")
	fs.StringVar(&f.progress, "progress", f.progress, "progress bar: auto (on a terminal), on or off")
	fs.StringVar(&f.logFormat, "log-format", f.logFormat, "log format: text or json")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address (empty: off)")
	bindTLSFlags(fs, &f.tlsCA, &f.tlsCert, &f.tlsKey, "this replica's certificate, for Raft and NATS (a replica certificate for --id)")
	fs.BoolVar(&f.insecure, "insecure", false, insecureFlagUsage)
	return cmd
}

func runServe(cmd *cobra.Command, spec runSpec, f serveFlags) error {
	if f.dataDir == "" {
		return errors.New("--data-dir is required")
	}
	log, err := newLogger(cmd, f.logFormat, slog.LevelInfo)
	if err != nil {
		return err
	}
	peers, err := parsePeers(f.peers)
	if err != nil {
		return err
	}
	if log, err = guardTransport(log, f.endpoints(peers), tlsFlagsGiven(cmd.Flags()), f.insecure); err != nil {
		return err
	}
	if f.join && f.bootstrap {
		return errors.New("--join and --bootstrap exclude each other: a replica either starts a cluster or joins one")
	}
	rcfg := coordinator.DefaultReplicaConfig()
	rcfg.ID, rcfg.RaftAddr, rcfg.DataDir, rcfg.Bootstrap, rcfg.Peers = f.id, f.raftAddr, f.dataDir, f.bootstrap, peers
	if rcfg.DialAddrs, err = parseRaftDial(f.raftDial); err != nil {
		return err
	}
	if rcfg.TLS, err = loadRaftTLS(f.tlsCA, f.tlsCert, f.tlsKey); err != nil {
		return err
	}
	if err := rcfg.Validate(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	gc := startGCTuner(log, gcTunePeriod)
	defer gc.Stop()
	seeded := f.insecureSeed != 0
	spec.keepLegacyNoise(f.dataDir, log)
	spec.keepLegacyAccountant(f.dataDir, log)
	spec.keepLedgerDelta(f.dataDir)
	if err := checkDataDirFree(f.dataDir); err != nil {
		return err
	}
	if _, err := coordinator.CheckDataDirOwner(f.dataDir, f.id); err != nil {
		return fmt.Errorf("--id %s --data-dir %s: %w", f.id, f.dataDir, err)
	}
	if err := checkHasCluster(f, peers); err != nil {
		return err
	}
	if err := checkMetricsAddr(f.metricsAddr); err != nil {
		return err
	}
	pr, err := spec.prepare(ctx, seeded, f.dataDir, log)
	if err != nil {
		return err
	}
	if err := spec.checkPlannedBudget(pr.cfg); err != nil {
		return err
	}
	natsTLS, err := tlsFiles(f.tlsCA, f.tlsCert, f.tlsKey)
	if err != nil {
		return err
	}
	tcfg := transport.DefaultConfig()
	if f.nats != "" {
		if f.natsCluster != "" || f.natsRoutes != "" || f.natsAdv != "" || f.clusterAdv != "" {
			return errors.New("--nats-cluster, --nats-routes and the --nats-*advertise flags configure the embedded server; they do not go with --nats")
		}
		tcfg.URLs = strings.Split(f.nats, ",")
		tcfg.RetryConnect = true // the NATS servers may start after us
		tcfg.TLS = natsTLS
	} else if tcfg.Embedded, err = embeddedServerConfig(f.natsListen, f.natsCluster, f.natsRoutes); err != nil {
		return err
	} else {
		tcfg.Embedded.TLS = natsTLS
		tcfg.Embedded.ClientAdvertise, tcfg.Embedded.ClusterAdvertise = f.natsAdv, f.clusterAdv
	}
	srv, err := openServer(ctx, cmd, spec, pr, serverOptions{
		replica: rcfg, nats: tcfg, metricsAddr: f.metricsAddr, progress: f.progress, insecureSeed: f.insecureSeed,
		join: f.join, insecure: f.insecure,
	}, log)
	if err != nil {
		return err
	}
	defer srv.close()
	if tcfg.URLs == nil {
		log.Info("embedded NATS server", "url", srv.conn.ServerURL())
	}
	sum, err := srv.server.Run(ctx)
	srv.progress.finish()
	if interrupted(ctx, err) {
		// Closing the replica (deferred) transfers leadership if it leads.
		log.Info("shutting down on signal; the run continues on the other replicas or when restarted", "step", sum.Steps,
			"charged_step", sum.Charged, "epsilon", sum.Epsilon)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "run %s finished after %d steps (%s): ε = %.4f at δ = %g%s\n",
		pr.cfg.Run, sum.Steps, sum.Stopped, sum.Epsilon, sum.Delta, unappliedCharge(sum.Steps, sum.Charged))
	if line := divergedWarning(sum.Stopped); line != "" {
		fmt.Fprintln(cmd.OutOrStdout(), line)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "state sha256 %s (θ and optimizer state at step %d)\n", sum.Digest, sum.Steps)
	// The run is over: leave the model beside the ledger.
	modelPath := filepath.Join(f.dataDir, ModelFile)
	c, err := exportModel(f.dataDir, modelPath, "safetensors", spec.InitFrom)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "model: %s (θ at step %d, safetensors)\n", modelPath, sum.Steps)
	fine, err := writeFinetuned(c, f.dataDir)
	if err != nil {
		return err
	}
	if fine != "" {
		fmt.Fprintln(cmd.OutOrStdout(), finetunedLine(fine, c.Step))
	}
	if line := evalSummary(pr.eval, sum); line != "" {
		fmt.Fprintln(cmd.OutOrStdout(), line)
	}
	return nil
}

// checkHasCluster refuses, before any data loads, a replica that would
// wait forever: on a data dir without Raft state it has no configuration,
// hence no peer to elect a leader with, unless it bootstraps one
// (--bootstrap), is listed in the --peers another replica bootstraps, or
// asks a running cluster to add it (--join).
func checkHasCluster(f serveFlags, peers []raft.Server) error {
	if f.bootstrap || f.join || len(peers) > 0 {
		return nil
	}
	has, err := coordinator.HasRaftState(f.dataDir)
	if err != nil {
		return fmt.Errorf("--data-dir %s: %w", f.dataDir, err)
	}
	if !has {
		return fmt.Errorf("--data-dir %s holds no Raft state, so this replica has no cluster: pass --bootstrap on the first replica's first start "+
			"(with --peers id=host:port,... for a group of replicas), or --join to join a running cluster", f.dataDir)
	}
	return nil
}

// endpoints are the addresses serve listens on or dials: Raft's, its
// peers', and the NATS servers' it dials or the embedded server's.
func (f serveFlags) endpoints(peers []raft.Server) []endpoint {
	eps := endpoints("--raft-addr", f.raftAddr)
	for _, p := range peers {
		eps = append(eps, endpoints("--peers", string(p.Address))...)
	}
	if dial, err := parseRaftDial(f.raftDial); err == nil {
		for _, a := range dial {
			eps = append(eps, endpoints("--raft-dial", a)...)
		}
	}
	if f.nats != "" {
		return append(eps, endpoints("--nats", strings.Split(f.nats, ",")...)...)
	}
	eps = append(eps, endpoints("--nats-listen", f.natsListen)...)
	if f.natsCluster != "" {
		eps = append(eps, endpoints("--nats-cluster", f.natsCluster)...)
	}
	if f.natsAdv != "" {
		eps = append(eps, endpoints("--nats-advertise", f.natsAdv)...)
	}
	if f.clusterAdv != "" {
		eps = append(eps, endpoints("--nats-cluster-advertise", f.clusterAdv)...)
	}
	if f.natsRoutes != "" {
		eps = append(eps, endpoints("--nats-routes", strings.Split(f.natsRoutes, ",")...)...)
	}
	return eps
}

// loadRaftTLS loads the Raft transport's mutual TLS from --tls-ca,
// --tls-cert and --tls-key: all three, or none (nil: plain TCP).
func loadRaftTLS(ca, cert, key string) (*raftnet.TLS, error) {
	files, err := tlsFiles(ca, cert, key)
	if err != nil || files.CertFile == "" {
		return nil, err
	}
	return raftnet.LoadTLS(ca, cert, key)
}

// parsePeers parses id=host:port,... into Raft servers.
func parsePeers(s string) ([]raft.Server, error) {
	if s == "" {
		return nil, nil
	}
	var out []raft.Server
	seen := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--peers: %q is not id=host:port", p)
		}
		if seen[id] {
			return nil, fmt.Errorf("--peers: %q listed twice", id)
		}
		seen[id] = true
		out = append(out, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(addr)})
	}
	return out, nil
}

// parseRaftDial parses --raft-dial, id=host:port,..., into
// ReplicaConfig.DialAddrs (nil when empty).
func parseRaftDial(s string) (map[string]string, error) {
	servers, err := parsePeers(s)
	if err != nil {
		return nil, fmt.Errorf("--raft-dial: %w", err)
	}
	if len(servers) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(servers))
	for _, sv := range servers {
		m[string(sv.ID)] = string(sv.Address)
	}
	return m, nil
}

// embeddedServerConfig is the embedded NATS server listening on addr and,
// with cluster set, accepting routes there and dialing routes.
func embeddedServerConfig(addr, cluster, routes string) (transport.EmbeddedServerConfig, error) {
	sc := transport.DefaultEmbeddedServerConfig()
	host, port, err := splitHostPort(addr)
	if err != nil {
		return sc, fmt.Errorf("--nats-listen: %w", err)
	}
	sc.Host, sc.Port = host, port
	if cluster == "" {
		if routes != "" {
			return sc, errors.New("--nats-routes needs --nats-cluster")
		}
		return sc, nil
	}
	if sc.ClusterHost, sc.ClusterPort, err = splitHostPort(cluster); err != nil {
		return sc, fmt.Errorf("--nats-cluster: %w", err)
	}
	sc.ClusterName = "dpcluster"
	if routes != "" {
		sc.Routes = strings.Split(routes, ",")
	}
	return sc, sc.Validate()
}

// serverOptions are a replica's local choices, shared by local and serve.
type serverOptions struct {
	replica      coordinator.ReplicaConfig
	nats         transport.Config
	metricsAddr  string
	progress     string
	insecureSeed uint64
	minNodes     int // overrides the spec's when > 0
	join         bool
	insecure     bool // --insecure: reported in the replica's status
	// registry, if set, receives the metrics instead of a new registry;
	// onStep, if set, is called after the progress bar's update (both
	// LocalHooks).
	registry *prometheus.Registry
	onStep   func(coordinator.Progress)
}

// openedServer is a replica with its NATS connection and round loop.
type openedServer struct {
	server   *coordinator.Server
	conn     *transport.Client
	replica  *coordinator.Replica
	progress *progress
	registry *prometheus.Registry
	closers  []io.Closer
}

// configured reports whether the replica applied the run's
// configuration (its ledger then holds the run record); false for a
// server that never opened (nil).
func (o *openedServer) configured() bool {
	if o == nil || o.replica == nil {
		return false
	}
	_, ok := o.replica.FSM().Config()
	return ok
}

func (o *openedServer) close() {
	for i := len(o.closers) - 1; i >= 0; i-- {
		o.closers[i].Close()
	}
}

// openServer connects to NATS (or starts the embedded broker), opens the
// replica and builds its Server, with metrics and progress reporting. The
// caller runs o.server.Run and then calls o.close.
func openServer(ctx context.Context, cmd *cobra.Command, spec runSpec, pr preparedRun, opts serverOptions, log *slog.Logger) (o *openedServer, err error) {
	o = &openedServer{registry: opts.registry}
	if o.registry == nil {
		o.registry = newRegistry()
	}
	defer func() {
		if err != nil {
			o.close()
		}
	}()
	rc := pr.cfg
	seeded := opts.insecureSeed != 0
	if seeded {
		log.Warn("--insecure-seed: the noise is SEEDED; this run is NOT differentially private")
	}
	log.Info("run", "run", rc.Run, "model", spec.modelName(), "params", rc.Dim, "examples", rc.TotalExamples,
		"q", rc.SampleRate, "sigma", rc.Optimizer.NoiseMultiplier, "clip", rc.Optimizer.ClipNorm, "noise", noiseModeName(rc.NoiseMode), "accountant", accountantName(rc.Accountant),
		"batch", rc.Optimizer.ExpectedBatchSize, "algorithm", rc.Optimizer.Algorithm,
		"target_epsilon", rc.TargetEpsilon, "delta", rc.Delta, "max_steps", rc.MaxSteps,
		"replica", opts.replica.ID, "data_dir", opts.replica.DataDir, "eval_data", evalLabel(pr.eval))
	// With a certificate, the client's name is the certificate's ID (for
	// serve, --id: ReplicaConfig.Validate checks the Raft certificate;
	// local's single replica is "local" whatever certificate it serves).
	opts.nats.Run, opts.nats.Role = rc.Run, pki.RoleReplica
	if opts.nats.TLS.CertFile == "" && opts.nats.Embedded.TLS.CertFile == "" {
		opts.nats.Name = opts.replica.ID
	}
	if o.conn, err = transport.Connect(ctx, opts.nats, log); err != nil {
		return o, err
	}
	o.closers = append(o.closers, o.conn)
	opts.replica.Logger = log
	if o.replica, err = coordinator.OpenReplica(opts.replica, initFunc(spec.InitFrom, log, pr.model)); err != nil {
		return o, err
	}
	o.closers = append(o.closers, o.replica)
	metrics, err := coordinator.NewMetrics(o.registry, rc.Run, opts.replica.ID)
	if err != nil {
		return o, err
	}
	if err := registerTransport(o.registry, o.conn, rc.Run); err != nil {
		return o, err
	}
	if o.progress, err = newProgress(stderr(cmd), opts.progress, log); err != nil {
		return o, err
	}
	scfg := spec.serverConfig()
	if opts.minNodes > 0 {
		scfg.MinNodes = opts.minNodes
	}
	scfg.Metrics, scfg.OnStep, scfg.Join, scfg.Insecure = metrics, o.progress.update, opts.join, opts.insecure
	if hook := opts.onStep; hook != nil {
		bar := o.progress.update
		scfg.OnStep = func(p coordinator.Progress) { bar(p); hook(p) }
	}
	if pr.eval.Data != nil {
		if scfg.Evaluator, err = newModelEvaluator(pr.model, pr.eval.Data); err != nil {
			return o, err
		}
		scfg.EvalData = evalKind(pr.eval)
	}
	if seeded {
		scfg.Noise = mechanism.NewSeededNoiseSource(opts.insecureSeed)
	}
	// Under a progress bar, the round loop's info logs would tear the
	// bar; warnings still show.
	serverLog := log
	if o.progress.bar {
		serverLog = quietLogger(log)
	}
	if o.server, err = coordinator.NewServer(o.replica, o.conn, rc, scfg, serverLog); err != nil {
		return o, err
	}
	if opts.metricsAddr != "" {
		// Every replica serves its own view: followers too.
		if _, _, err := serveMetrics(ctx, opts.metricsAddr, o.registry, dashboard.New(o.server), log); err != nil {
			return o, err
		}
	}
	return o, nil
}

// splitHostPort splits host:port with a numeric port (-1: any free port).
func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	return host, port, nil
}

func newRemoveReplicaCmd() *cobra.Command {
	var nats, runName, history, tlsCA, tlsCert, tlsKey string
	var listen time.Duration
	cmd := &cobra.Command{
		Use:   "remove-replica ID",
		Short: "Ask the coordinator leader to remove a replica from the Raft group",
		Long: `remove-replica publishes a removal request for replica ID on the run's NATS control subject;
the current leader removes it from the Raft configuration. Check with coordinator status. The
leader does not remove itself: stop it (it transfers leadership first) and remove it from the
new leader. Over TLS only a replica certificate may publish on the control subject: give one
with --tls-ca, --tls-cert and --tls-key.`,
		Example: `  coordinator remove-replica r3 --nats tls://10.0.0.1:4222 --run fashion-mlp \
      --tls-ca certs/ca.crt --tls-cert certs/r1.crt --tls-key certs/r1.key`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if nats == "" {
				return errors.New("--nats is required")
			}
			files, err := tlsFiles(tlsCA, tlsCert, tlsKey)
			if err != nil {
				return err
			}
			cfg := transport.DefaultConfig()
			cfg.Run, cfg.URLs, cfg.TLS, cfg.Role = runName, strings.Split(nats, ","), files, pki.RoleReplica
			if files.CertFile == "" {
				cfg.Name = "admin"
			}
			conn, err := transport.Connect(cmd.Context(), cfg, nil)
			if err != nil {
				return err
			}
			defer conn.Close()
			if history == "" {
				if history, err = replicaGroup(cmd.Context(), conn, runName, listen); err != nil {
					return err
				}
			}
			if history == "" {
				fmt.Fprintf(stderr(cmd), "no replica of run %s reported within %v: the request names no replica group\n", runName, listen)
			}
			err = conn.Publish(cmd.Context(), transport.Control{Run: runName, From: conn.Name(), Code: transport.ControlRemove,
				Replica: args[0], History: history})
			if err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "asked the leader of run %s to remove replica %s\n", runName, args[0])
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&nats, "nats", "", "NATS server URLs, comma-separated (required)")
	fs.StringVar(&runName, "run", defaultRunSpec().Run, "run name")
	fs.StringVar(&history, "history", "", "the replica group's history ID (coordinator status shows it); by default the one the replicas report")
	fs.DurationVar(&listen, "listen", 3*time.Second, "how long to listen for the replicas' reports before asking")
	bindTLSFlags(fs, &tlsCA, &tlsCert, &tlsKey, "a replica certificate of the run (only replicas may change the membership)")
	return cmd
}

// replicaGroup listens on run's control subject for d and returns the
// history ID the replicas report, "" if none reported, or an error if
// replicas of more than one group answer under the run's name (an
// operator's copy of a run file on the same NATS): a removal must name
// its group.
func replicaGroup(ctx context.Context, conn *transport.Client, run string, d time.Duration) (string, error) {
	var mu sync.Mutex
	groups := map[string]map[string]bool{} // history → replica IDs
	sub, err := conn.Subscribe(transport.TopicControl, func(m transport.Message) {
		if c, ok := m.(transport.Control); ok && c.Code == transport.ControlReplica && c.History != "" {
			mu.Lock()
			if groups[c.History] == nil {
				groups[c.History] = map[string]bool{}
			}
			groups[c.History][c.From] = true
			mu.Unlock()
		}
	})
	if err != nil {
		return "", err
	}
	defer sub.Unsubscribe()
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(d):
	}
	mu.Lock()
	defer mu.Unlock()
	if len(groups) > 1 {
		var desc []string
		for _, h := range slices.Sorted(maps.Keys(groups)) {
			desc = append(desc, fmt.Sprintf("%s (%s)", h, strings.Join(slices.Sorted(maps.Keys(groups[h])), ", ")))
		}
		return "", fmt.Errorf("replicas of %d groups answer for run %s: %s; pass --history to name yours", len(groups), run, strings.Join(desc, "; "))
	}
	for h := range groups {
		return h, nil
	}
	return "", nil
}

// interrupted reports whether err is the cancellation of ctx by a signal:
// a clean, resumable stop rather than a failure.
func interrupted(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled)
}

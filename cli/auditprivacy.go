package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/privacyaudit"
	"github.com/dpcluster/dpcluster/transport"
)

// errPrivacyBug is returned by audit-privacy when a lower bound exceeds
// the ledger's ε: the run leaked more than it was charged for.
var errPrivacyBug = errors.New("audit-privacy: PRIVACY BUG: an empirical lower bound on ε exceeds the ledger's ε")

// errRunCurveRejected is returned by audit-privacy when the guesses reject
// the run's own trade-off curve: the run does not release what the ledger
// charges.
var errRunCurveRejected = errors.New("audit-privacy: PRIVACY BUG: the guesses reject the trade-off curve of the mechanism the ledger charges")

// auditFile is the file in an audited run's data dir that says the run
// was an audit, and holds its result once it has one.
const auditFile = "AUDIT.json"

type auditFlags struct {
	local           localFlags
	canaries        int
	inputCanaries   int
	canaryScale     float64
	canarySupport   int
	beta            float64
	reachReps       int
	dataDirChanged  bool
	minNodesChanged bool
	canariesChanged bool
}

// auditMethod is one threat model's outcome, under the two analyses of
// privacyaudit.Audit: the (ε, δ) one (Epsilon, Ceiling, Best) and the
// f-DP one for μ-GDP (the FDP fields, GDPMu; BestFDP is its best split);
// and under the f-DP analysis with the run's own curve
// (privacyaudit.RunCurveBound: the RunCurve fields).
type auditMethod struct {
	Canaries int     `json:"canaries"`
	Included int     `json:"included"`
	Epsilon  float64 `json:"epsilon_lower_bound"`
	// Ceiling is the largest bound any of the splits could give (all its
	// guesses right), at its share of β.
	Ceiling float64 `json:"ceiling"`
	// EpsilonFDP is the f-DP bound: the ε at the run's δ of the largest μ
	// whose μ-GDP the guesses reject (GDPMu); CeilingFDP its ceiling.
	EpsilonFDP float64 `json:"epsilon_lower_bound_fdp"`
	GDPMu      float64 `json:"gdp_mu_lower_bound"`
	CeilingFDP float64 `json:"ceiling_fdp"`
	// EpsilonRunCurve is the run-curve bound: the ledger accountant's ε at
	// the run's δ for the smallest σ' whose curve (T steps of the charged
	// mechanism at σ') the guesses reject, RunCurveSigma (0: none up to
	// 16σ); RunCurveRejected says they reject the run's own σ: a proof.
	EpsilonRunCurve  float64               `json:"epsilon_lower_bound_run_curve"`
	RunCurveSigma    float64               `json:"run_curve_sigma"`
	RunCurveRejected bool                  `json:"run_curve_rejected"`
	Best             privacyaudit.Result   `json:"best"`
	BestFDP          privacyaudit.Result   `json:"best_fdp"`
	Splits           []privacyaudit.Result `json:"splits"`
}

// exceeds reports whether the (ε, δ) bound, a lower bound on the ε of any
// (ε, δ)-DP mechanism, is above the ledger's ε: a privacy bug.
func (a *auditMethod) exceeds(ledger float64) bool {
	return a != nil && a.Epsilon > ledger
}

// fdpExceeds reports whether the f-DP bound is above the ledger's ε: a
// suspected bug, not a proven one, since the run's mechanism is not
// μ-GDP (docs/PRIVACY.md, "What its ε means, and the exit status").
func (a *auditMethod) fdpExceeds(ledger float64) bool {
	return a != nil && a.EpsilonFDP > ledger
}

// auditResult is audit-privacy's result (--json, and AUDIT.json).
type auditResult struct {
	Run           string  `json:"run"`
	Steps         int64   `json:"steps"`
	Releases      int64   `json:"releases_read"`
	LedgerEpsilon float64 `json:"ledger_epsilon"`
	Delta         float64 `json:"delta"`
	Confidence    float64 `json:"confidence"`
	Sigma         float64 `json:"noise_multiplier"`
	SampleRate    float64 `json:"sample_rate"`
	// Rejected counts the contributions the leader rejected
	// (dpcluster_coordinator_contributions_rejected_total): an honest
	// audited run has none, since every node claims the population its
	// sampler draws from (auditRunConfig).
	Rejected int64 `json:"contributions_rejected"`
	// CanarySpan is the number of leading parameters the gradient
	// canaries' directions lie in (canarySpan: the output layer's are
	// left out when the canaries fit without them).
	CanarySpan int         `json:"canary_span"`
	DataDir    string      `json:"data_dir"`
	WhiteBox   auditMethod `json:"white_box"`
	// Reach is the ideal white-box audit's bound on a perfect mechanism
	// with this run's m, q, T, σ, δ, β and splits (privacyaudit.IdealReach):
	// what the method can show here. Absent with --reach-reps 0.
	Reach    *privacyaudit.Reach `json:"white_box_reach,omitempty"`
	BlackBox *auditMethod        `json:"black_box,omitempty"`
	// PrivacyBug says an (ε, δ) bound exceeds the ledger's ε or the
	// guesses reject the run's own curve (RunCurveRejected): both proofs,
	// the exit status; FDPAboveLedger says a μ-GDP bound exceeds the
	// ledger's ε (a warning).
	PrivacyBug       bool `json:"privacy_bug"`
	RunCurveRejected bool `json:"run_curve_rejected"`
	FDPAboveLedger   bool `json:"fdp_above_ledger"`
}

func newAuditPrivacyCmd() *cobra.Command {
	spec := defaultRunSpec()
	f := auditFlags{local: localFlags{nodes: 3, progress: "auto", logFormat: "text", device: "cpu"},
		canaries: defaultCanaries, inputCanaries: 1000, canaryScale: 10, canarySupport: 1, beta: 0.05, reachReps: 21}
	cmd := &cobra.Command{
		Use:   "audit-privacy",
		Short: "Measure a lower bound on the run's ε with canaries, beside the ledger's ε",
		Long: `audit-privacy runs one training run as coordinator local does (embedded NATS, one replica,
its ledger, in-process nodes) with canaries, and prints an empirical lower bound on ε at the run's δ
and confidence 1−β (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run",
2023), next to the ledger's ε and the most the canaries could show (the ceiling).

White-box: --canaries gradient canaries, each included with probability ½, are extra examples of
the nodes' shards, Poisson-sampled with the run's q; a sampled one adds a gradient of norm
--canary-scale·C along a secret direction, clipped to C. The auditor reads every released g̃ from
the replica's Raft log and scores each canary by the subsampled Gaussian's likelihood ratio.
Black-box: --input-canaries training rows with a wrong label, each included with probability ½,
scored by the final model's loss.

The exit status is non-zero when an (ε, δ) lower bound exceeds the ledger's ε, or when the
guesses reject the trade-off curve of the mechanism the ledger charges (T steps of the Poisson-
subsampled Gaussian at the run's σ, from the PLD accountant): a privacy bug, either way. A bound far
below it is not evidence of anything (docs/PRIVACY.md). The run's name gets the prefix audit-, its
data dir holds AUDIT.json; it is removed after the audit unless --data-dir is given.`,
		Example: `  coordinator audit-privacy --target-epsilon 8
  coordinator audit-privacy --model logreg --dataset gaussian --max-steps 300 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadRunSpec(&spec, f.local.config, cmd.Flags()); err != nil {
				return err
			}
			f.dataDirChanged = cmd.Flags().Changed("data-dir")
			f.canariesChanged = cmd.Flags().Changed("canaries")
			f.minNodesChanged = cmd.Flags().Changed("min-nodes")
			return runAudit(cmd, spec, f)
		},
	}
	fs := cmd.Flags()
	spec.bind(fs)
	fs.StringVar(&f.local.config, "config", "", "YAML run file; flags override it")
	fs.StringVar(&f.local.dataDir, "data-dir", "", "directory for the audited run (must not exist or be empty; kept). Default: a temporary directory, removed after")
	fs.IntVar(&f.local.nodes, "nodes", f.local.nodes, "number of in-process nodes")
	fs.StringVar(&f.local.progress, "progress", f.local.progress, "progress bar: auto (on a terminal), on or off")
	fs.StringVar(&f.local.logFormat, "log-format", f.local.logFormat, "log format: text or json")
	fs.StringVar(&f.local.device, "device", f.local.device, deviceFlagUsage)
	fs.BoolVar(&f.local.json, "json", false, "print the result as JSON")
	fs.IntVar(&f.canaries, "canaries", f.canaries, "white-box gradient canaries m (each included with probability ½); with --canary-support 1 at most the model's parameters (the default is capped there)")
	fs.IntVar(&f.inputCanaries, "input-canaries", f.inputCanaries, "black-box mislabelled-record canaries (0: none)")
	fs.Float64Var(&f.canaryScale, "canary-scale", f.canaryScale, "a gradient canary's norm before clipping, in units of C (> 1: the clip must bound it)")
	fs.IntVar(&f.canarySupport, "canary-support", f.canarySupport, "coordinates of each gradient canary's direction: 1, a coordinate of its own (a keyed permutation), or more, random coordinates that canaries may share (capped at the model's parameters)")
	f.local.budget.bind(fs)
	fs.Float64Var(&f.beta, "beta", f.beta, "1 − confidence of the lower bound")
	fs.IntVar(&f.reachReps, "reach-reps", f.reachReps, "repetitions of the simulated ideal white-box audit that gives the method's reach (0: skip)")
	return cmd
}

func (f *auditFlags) check() error {
	switch {
	case f.canaries < 10:
		return fmt.Errorf("--canaries %d: at least 10", f.canaries)
	case f.inputCanaries != 0 && f.inputCanaries < 10:
		return fmt.Errorf("--input-canaries %d: 0 or at least 10", f.inputCanaries)
	case !(f.canaryScale > 1) || math.IsInf(f.canaryScale, 0):
		return fmt.Errorf("--canary-scale %v: must be > 1 and finite", f.canaryScale)
	case f.canarySupport < 1:
		return fmt.Errorf("--canary-support %d: must be ≥ 1", f.canarySupport)
	case f.reachReps < 0:
		return fmt.Errorf("--reach-reps %d: must be ≥ 0", f.reachReps)
	case !(f.beta > 0 && f.beta < 1):
		return fmt.Errorf("--beta %v: must be in (0, 1)", f.beta)
	case f.local.nodes < 1:
		return fmt.Errorf("--nodes %d must be at least 1", f.local.nodes)
	}
	return f.local.budget.check()
}

// defaultCanaries is --canaries' default (docs/PRIVACY.md, "Coordinate
// canaries").
const defaultCanaries = 120000

// fitDim fits the canaries to a model of dim parameters: with support 1
// each canary has a coordinate of its own, so there are at most dim of
// them; the default m is capped at dim, a given one above it refused.
func (f *auditFlags) fitDim(dim int) error {
	if f.canarySupport == 1 && f.canaries > dim && !f.canariesChanged {
		f.canaries = dim
	}
	if f.canarySupport == 1 && f.canaries > dim {
		return fmt.Errorf("--canaries %d with --canary-support 1: at most the model's %d parameters (each coordinate canary has a coordinate of its own); use fewer, or --canary-support > 1 (directions that may overlap)",
			f.canaries, dim)
	}
	return nil
}

// auditDataDir makes the audited run's data dir: --data-dir, which must
// not exist or be empty (an audit's coins live in this process: it cannot
// resume), or a temporary one that cleanup removes.
func auditDataDir(f *auditFlags) (cleanup func(), err error) {
	if !f.dataDirChanged {
		dir, err := os.MkdirTemp("", "dpcluster-audit-")
		if err != nil {
			return nil, err
		}
		f.local.dataDir = dir
		return func() { os.RemoveAll(dir) }, nil
	}
	if f.local.dataDir == "" {
		return nil, errors.New("--data-dir must not be empty")
	}
	ents, err := os.ReadDir(f.local.dataDir)
	if err == nil && len(ents) > 0 {
		return nil, fmt.Errorf("--data-dir %s is not empty: an audit runs once, from the start, in a fresh directory", f.local.dataDir)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return func() {}, os.MkdirAll(f.local.dataDir, 0o755)
}

func runAudit(cmd *cobra.Command, spec runSpec, f auditFlags) error {
	if err := f.check(); err != nil {
		return err
	}
	if spec.Dataset == "none" || spec.Dataset == dataset.NameLocal {
		return errors.New("audit-privacy trains in one process on one training set: give --dataset or --data-path")
	}
	if len(spec.Nodes) > 0 && len(spec.Nodes) != f.local.nodes {
		return fmt.Errorf("--nodes %d: the run names %d nodes", f.local.nodes, len(spec.Nodes))
	}
	// A built-in dataset's model is known without its data: the canaries
	// are checked against it before anything is created (file data shapes
	// its model: auditRun checks once it is loaded).
	if spec.Dataset != dataset.NameFile && spec.Dataset != dataset.NameCSV {
		if m, err := spec.modelFor(nil, 0, 0); err == nil {
			if err := f.fitDim(m.NumParams()); err != nil {
				return err
			}
		}
	}
	spec.Run = auditRunName(spec.Run)
	log, err := newLogger(cmd, f.local.logFormat, slog.LevelInfo)
	if err != nil {
		return err
	}
	// Interrupted, the audit stops its run and removes a temporary data
	// dir (an audit cannot resume).
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd.SetContext(ctx)
	cleanup, err := auditDataDir(&f)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := writeAuditFile(f.local.dataDir, map[string]any{"audit": true, "canaries": f.canaries, "input_canaries": f.inputCanaries}); err != nil {
		return err
	}
	log.Warn("PRIVACY AUDIT: this run trains with canaries; its model is for the audit, not for use", "run", spec.Run, "data_dir", f.local.dataDir)
	res, err := auditRun(cmd, spec, f, log)
	if err != nil {
		return err
	}
	if err := writeAuditFile(f.local.dataDir, res); err != nil {
		return err
	}
	if err := printPrivacyAudit(cmd.OutOrStdout(), res, f.local.json); err != nil {
		return err
	}
	return auditErr(res)
}

// auditErr is audit-privacy's exit status for a result: errPrivacyBug when
// an (ε, δ) bound exceeds the ledger's ε, errRunCurveRejected when the
// guesses reject the run's own curve, nil otherwise (an f-DP bound for
// μ-GDP above the ledger's ε is only a warning).
func auditErr(res auditResult) error {
	switch {
	case res.WhiteBox.exceeds(res.LedgerEpsilon) || res.BlackBox.exceeds(res.LedgerEpsilon):
		return errPrivacyBug
	case res.RunCurveRejected:
		return errRunCurveRejected
	}
	return nil
}

// auditRunName prefixes the run's name with audit-, so that its ledger
// and subjects say it was an audit.
func auditRunName(run string) string {
	const prefix = "audit-"
	if len(run) >= len(prefix) && run[:len(prefix)] == prefix {
		return run
	}
	if run = prefix + run; len(run) > 64 {
		run = run[:64]
	}
	return run
}

func writeAuditFile(dir string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, auditFile), append(b, '\n'), 0o644)
}

// auditRun prepares the run with its canaries, trains it through the
// real path, and scores the canaries.
func auditRun(cmd *cobra.Command, spec runSpec, f auditFlags, log *slog.Logger) (auditResult, error) {
	ctx := cmd.Context()
	r, err := auditRand()
	if err != nil {
		return auditResult{}, err
	}
	pr, err := spec.prepare(ctx, false, "", log)
	if err != nil {
		return auditResult{}, err
	}
	private := pr.train // the private set, before the input canaries join it
	var in *inputCanaries
	if f.inputCanaries > 0 {
		if in, pr.train, err = newInputCanaries(r, pr.train, f.inputCanaries); err != nil {
			return auditResult{}, err
		}
	}
	n := int64(pr.train.Len())
	main, err := spec.runConfig(pr.model, n, "", false, f.local.dataDir, log)
	if err != nil {
		return auditResult{}, err
	}
	if err := spec.checkPlannedBudget(main); err != nil {
		return auditResult{}, err
	}
	if err := f.fitDim(main.Dim); err != nil {
		return auditResult{}, err
	}
	if pr.cfg, err = auditRunConfig(spec, pr, main, f.canaries, f.local.dataDir, log); err != nil {
		return auditResult{}, err
	}
	// The audit trains on the private set like any run: admitted to its
	// dataset budget, if it has one, and settled when the run stops.
	configured := false
	if f.local.budget.dir != "" {
		adm, err := admitToDataset(f.local.budget, private, spec.datasetLabel(), &pr.cfg, f.local.dataDir, log)
		if err != nil {
			return auditResult{}, err
		}
		defer func() { adm.settle(configured, log) }()
	}
	rc := pr.cfg
	span := canarySpan(pr.model.Params(), f.canaries, f.canarySupport, rc.Dim)
	gc := newGradientCanaries(r, f.canaries, n, f.local.nodes, f.canarySupport, span, f.canaryScale)
	f.local.nodeConfig = gc.nodeConfig
	committed, sum, rejected, err := trainAudited(ctx, cmd, spec, pr, f.local, f.minNodesChanged, &configured, log)
	if err != nil {
		return auditResult{}, err
	}
	res := auditResult{Run: rc.Run, Steps: committed.Step, LedgerEpsilon: committed.Epsilon, Delta: rc.Delta, Confidence: 1 - f.beta,
		Sigma: rc.Optimizer.NoiseMultiplier, SampleRate: rc.SampleRate, DataDir: f.local.dataDir, Rejected: rejected, CanarySpan: span}
	if rejected > 0 {
		log.Warn("audit: the leader rejected contributions of this run's nodes: their rounds released without them", "rejected", rejected)
	}
	if !f.dataDirChanged {
		res.DataDir = "(removed)"
	}
	log.Info("audit: scoring the gradient canaries from the Raft log", "steps", sum.Steps)
	scores, releases, err := gc.scores(f.local.dataDir, rc)
	if err != nil {
		return auditResult{}, err
	}
	if res.Releases = releases; releases < committed.Step {
		return auditResult{}, fmt.Errorf("audit-privacy: the Raft log holds %d releases for %d steps: the audit needs them all", releases, committed.Step)
	}
	fam := runFamily(rc, res.Releases) // every g̃ released, a recharged step's too
	start := time.Now()
	if res.WhiteBox, err = auditOf(scores, gc.included, rc.Delta, f.beta, fam); err != nil {
		return auditResult{}, err
	}
	log.Info("audit: white-box analyses done, the run-curve one included", "elapsed", time.Since(start).Round(time.Millisecond))
	if f.reachReps > 0 {
		if res.Reach, err = whiteBoxReach(res, f); err != nil {
			return auditResult{}, err
		}
	}
	if in != nil {
		s, err := in.scores(pr.model, committed.Theta)
		if err != nil {
			return auditResult{}, err
		}
		bb, err := auditOf(s, in.included, rc.Delta, f.beta, fam)
		if err != nil {
			return auditResult{}, err
		}
		res.BlackBox = &bb
	}
	res.RunCurveRejected = res.WhiteBox.RunCurveRejected || res.BlackBox != nil && res.BlackBox.RunCurveRejected
	res.PrivacyBug = res.WhiteBox.exceeds(res.LedgerEpsilon) || res.BlackBox.exceeds(res.LedgerEpsilon) || res.RunCurveRejected
	res.FDPAboveLedger = res.WhiteBox.fdpExceeds(res.LedgerEpsilon) || res.BlackBox.fdpExceeds(res.LedgerEpsilon)
	return res, nil
}

// reachSeed seeds the ideal audit's simulation: its result is a function
// of the run's parameters, the same on every machine.
const reachSeed = 31

// whiteBoxReach simulates the ideal white-box audit of a perfect mechanism
// with the run's parameters and the white-box splits, --reach-reps times
// or as many as privacyaudit.MaxIdealWork allows (nil when not one does).
func whiteBoxReach(res auditResult, f auditFlags) (*privacyaudit.Reach, error) {
	p := privacyaudit.Ideal{Canaries: f.canaries, SampleRate: res.SampleRate, Steps: int(res.Steps), Sigma: res.Sigma,
		Delta: res.Delta, Beta: f.beta, Splits: auditSplits(f.canaries)}
	reps := min(f.reachReps, int(privacyaudit.MaxIdealWork/(float64(p.Canaries)*float64(max(p.Steps, 1)))))
	if reps < 1 || p.Steps < 1 {
		return nil, nil
	}
	r, err := privacyaudit.IdealReach(p, reps, reachSeed)
	if err != nil {
		return nil, fmt.Errorf("audit-privacy: the ideal audit: %w", err)
	}
	return &r, nil
}

// runFamily is the run's own family for the run-curve analysis: steps
// runs of the event the ledger charges for a step of rc at noise
// multiplier σ' (RunConfig.Event), described for the PLD accountant
// (a discrete Gaussian with its lattice) whichever accountant the run
// uses: the same mechanism. Its curves are cached for the white-box and
// black-box analyses.
func runFamily(rc coordinator.RunConfig, steps int64) *privacyaudit.RunFamily {
	return &privacyaudit.RunFamily{Steps: steps, Sigma: rc.Optimizer.NoiseMultiplier, Event: func(sigma float64) accounting.Event {
		c := rc
		c.Optimizer.NoiseMultiplier, c.Accountant = sigma, coordinator.AccountantPLD
		return c.Event()
	}}
}

// auditOf runs both analyses of privacyaudit.Audit on the guesses, and
// the run-curve one with fam unless it is nil.
func auditOf(scores []float64, included []bool, delta, beta float64, fam *privacyaudit.RunFamily) (auditMethod, error) {
	best, all, err := privacyaudit.Audit(scores, included, auditSplits(len(scores)), delta, beta)
	if err != nil {
		return auditMethod{}, err
	}
	bf := privacyaudit.BestFDP(all)
	am := auditMethod{Canaries: len(scores), Epsilon: best.Epsilon, Best: best, Splits: all,
		EpsilonFDP: bf.EpsilonFDP, GDPMu: bf.GDPMu, BestFDP: bf}
	for _, in := range included {
		if in {
			am.Included++
		}
	}
	for _, s := range all {
		am.Ceiling = max(am.Ceiling, s.Ceiling)
		am.CeilingFDP = max(am.CeilingFDP, s.CeilingFDP)
	}
	if fam != nil && fam.Steps > 0 && delta > 0 {
		rc, err := privacyaudit.RunCurveBound(len(scores), all, fam, delta, beta)
		if err != nil {
			return auditMethod{}, fmt.Errorf("audit-privacy: the run-curve analysis: %w", err)
		}
		am.EpsilonRunCurve, am.RunCurveSigma, am.RunCurveRejected = rc.Epsilon, rc.Sigma, rc.Rejected
	}
	return am, nil
}

// trainAudited runs pr as coordinator local would, with a replica that
// keeps its whole Raft log (every g̃, for the auditor), and returns the
// committed state once the run has stopped and the replica is closed,
// with the number of contributions the leader rejected. It sets
// *configured to whether the replica applied the run's configuration.
func trainAudited(ctx context.Context, cmd *cobra.Command, spec runSpec, pr preparedRun, f localFlags, minNodesChanged bool, configured *bool, log *slog.Logger) (_ coordinator.Committed, _ coordinator.Summary, rejected int64, _ error) {
	raftAddr, err := freeLoopbackAddr()
	if err != nil {
		return coordinator.Committed{}, coordinator.Summary{}, 0, err
	}
	opts := serverOptions{nats: transport.DefaultConfig(), progress: f.progress}
	opts.nats.Embedded.Port = -1
	opts.replica = coordinator.DefaultReplicaConfig()
	opts.replica.ID, opts.replica.RaftAddr, opts.replica.DataDir, opts.replica.Bootstrap = "local", raftAddr, f.dataDir, true
	opts.replica.HeartbeatTimeout, opts.replica.ElectionTimeout, opts.replica.LeaderLeaseTimeout = localRaftTimeout, localRaftTimeout, localRaftTimeout
	// No compaction: the auditor reads every g̃ from the log.
	const all = math.MaxInt64
	opts.replica.SnapshotThreshold, opts.replica.TrailingLogs, opts.replica.FinalTrailingLogs, opts.replica.SnapshotModels = all, all, all, 0
	if !minNodesChanged {
		opts.minNodes = f.nodes
	}
	srv, err := openServer(ctx, cmd, spec, pr, opts, log)
	defer func() { *configured = srv.configured() }()
	if err != nil {
		return coordinator.Committed{}, coordinator.Summary{}, 0, err
	}
	closed := false
	defer func() {
		if !closed {
			srv.close()
		}
	}()
	nodeCtx, stopNodes := context.WithCancel(ctx)
	defer stopNodes()
	nodeErrs, err := startLocalNodes(nodeCtx, srv.conn.ServerURL(), transport.TLSConfig{}, pr.cfg, pr.model, pr.train, spec.ShardSeed, f, nil, srv.registry, quietLogger(log))
	if err != nil {
		return coordinator.Committed{}, coordinator.Summary{}, 0, err
	}
	sum, runErr := srv.server.Run(ctx)
	srv.progress.finish()
	stopNodes()
	for range f.nodes {
		<-nodeErrs
	}
	if runErr != nil {
		return coordinator.Committed{}, sum, 0, runErr
	}
	if ctx.Err() != nil {
		return coordinator.Committed{}, sum, 0, errors.New("audit-privacy: interrupted; an audit cannot resume")
	}
	if rejected, err = counterSum(srv.registry, "dpcluster_coordinator_contributions_rejected_total"); err != nil {
		return coordinator.Committed{}, sum, 0, err
	}
	committed, err := srv.replica.FSM().Committed()
	closed = true
	srv.close()
	return committed, sum, rejected, err
}

// counterSum returns the sum of the counter name over its labels in reg.
func counterSum(reg prometheus.Gatherer, name string) (int64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int64(n), nil
}

func printPrivacyAudit(out io.Writer, res auditResult, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(out, "audited %s: %d steps, σ = %.4f, q = %.6g; ledger ε = %.4f at δ = %g\n", res.Run, res.Steps, res.Sigma, res.SampleRate, res.LedgerEpsilon, res.Delta)
	if res.Rejected > 0 {
		fmt.Fprintf(out, "warning: the leader rejected %d contributions: their rounds released without those nodes' canaries\n", res.Rejected)
	}
	line := func(name string, a auditMethod) {
		fmt.Fprintf(out, "%s: ε ≥ %.4f with confidence %g (%d canaries, %d included; best guesses %d in, %d out: %d of %d right; ceiling %.4f)\n",
			name, a.Epsilon, res.Confidence, a.Canaries, a.Included, a.Best.KPlus, a.Best.KMinus, a.Best.V, a.Best.R, a.Ceiling)
		fmt.Fprintf(out, "%s, f-DP analysis: ε ≥ %.4f with confidence %g (not μ-GDP for μ < %.4f; best guesses %d in, %d out: %d of %d right; ceiling %.4f)\n",
			name, a.EpsilonFDP, res.Confidence, a.GDPMu, a.BestFDP.KPlus, a.BestFDP.KMinus, a.BestFDP.V, a.BestFDP.R, a.CeilingFDP)
		verdict := "not rejected"
		if a.RunCurveRejected {
			verdict = "REJECTED"
		}
		fmt.Fprintf(out, "%s, f-DP with the run's own curve: ε ≥ %.4f with confidence %g (less private than %d steps at σ' = %.4f; the run's σ = %.4f: %s)\n",
			name, a.EpsilonRunCurve, res.Confidence, res.Steps, a.RunCurveSigma, res.Sigma, verdict)
	}
	line("white-box (gradient canaries)", res.WhiteBox)
	if r := res.Reach; r != nil {
		fmt.Fprintf(out, "white-box reach (ideal audit of a perfect mechanism with these m, q, T, σ; %d simulations): median %.4f, 10–90%% %.4f–%.4f; a bound below it is lost to the system, one within it is all the method shows\n",
			r.Reps, r.Median, r.P10, r.P90)
		fmt.Fprintf(out, "white-box reach, f-DP analysis: median %.4f, 10–90%% %.4f–%.4f, largest %.4f\n", r.FDPMedian, r.FDPP10, r.FDPP90, r.FDPMax)
	}
	if res.BlackBox != nil {
		line("black-box (mislabelled records)", *res.BlackBox)
	}
	switch {
	case res.RunCurveRejected:
		fmt.Fprintln(out, "PRIVACY BUG: the guesses reject the trade-off curve of the mechanism the ledger charges (T steps at the run's σ)")
	case res.PrivacyBug:
		fmt.Fprintln(out, "PRIVACY BUG: a lower bound exceeds the ledger's ε")
	case res.FDPAboveLedger:
		fmt.Fprintln(out, "SUSPECTED PRIVACY BUG: an f-DP (μ-GDP) bound exceeds the ledger's ε; not a proof (the mechanism is not μ-GDP): rerun, and with more canaries")
	default:
		fmt.Fprintln(out, "no violation: every lower bound is at most the ledger's ε (a bound far below it shows nothing)")
	}
	return nil
}

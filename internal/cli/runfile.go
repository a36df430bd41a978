package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/raftlog"
)

// runSpec is a training run as a user describes it: the YAML run file
// (--config) and the flags of `coordinator local` and `coordinator serve`,
// which override the file. It becomes a coordinator.RunConfig (the public
// constants every replica agrees on) plus local choices (data, timing).
type runSpec struct {
	Run string `yaml:"run"`
	// Model is a preset name (logreg, mlp, cnn, textbag); ModelSpec, if
	// set, the path of a JSON model spec used instead.
	Model     string `yaml:"model"`
	ModelSpec string `yaml:"model_spec"`
	// Dataset is fashion-mnist, gaussian (a fixed synthetic Gaussian
	// mixture shaped by the model), csv, or, for serve only, none. The
	// nodes must load the same data (they and the coordinator both use
	// dataset.LoadRun).
	Dataset  string `yaml:"dataset"`
	Data     string `yaml:"data"`      // fashion-mnist: directory searched first
	DataPath string `yaml:"data_path"` // csv: the (private) training file
	// EvalPath (csv) is a separate, public evaluation file; EvalHoldout
	// (csv) instead holds that fraction of DataPath out of training for a
	// NON-PRIVATE evaluation. See dataset.RunOptions.
	EvalPath    string  `yaml:"eval_path"`
	EvalHoldout float64 `yaml:"eval_split_from_train"`
	// TotalExamples is N, the training examples across all nodes. Derived
	// from the dataset when one is loaded; `serve` without a dataset needs
	// it.
	TotalExamples int64 `yaml:"total_examples"`

	BatchSize     float64 `yaml:"batch_size"` // expected batch B; q = B/N
	Clip          float64 `yaml:"clip"`
	Sigma         float64 `yaml:"sigma"` // 0: calibrated to TargetEpsilon at MaxSteps
	TargetEpsilon float64 `yaml:"target_epsilon"`
	Delta         float64 `yaml:"delta"`
	MaxSteps      int64   `yaml:"max_steps"`

	// Noise is the leader's noise mechanism: discrete (the default: the sum
	// snapped to a fine grid plus exact discrete Gaussian noise) or float
	// (the legacy floating-point sampler, not protected against
	// floating-point attacks). A run whose ledger predates noise modes
	// keeps the floating-point sampler it started with (keepLegacyNoise).
	Noise string `yaml:"noise"`
	// legacyNoise is set by keepLegacyNoise, never by the user.
	legacyNoise bool
	// Accountant is the privacy accountant the budget is enforced and σ
	// calibrated with: pld (tighter; the default, for either noise mode:
	// it charges noise discrete through its lattice) or rdp. Empty: that
	// default. A run whose ledger predates accountants keeps RDP
	// (keepLegacyAccountant).
	Accountant string `yaml:"accountant"`
	// legacyAccountant is set by keepLegacyAccountant, never by the user.
	legacyAccountant bool

	Algorithm  string  `yaml:"algorithm"`
	LR         float64 `yaml:"lr"`
	Beta1      float64 `yaml:"beta1"`
	Beta2      float64 `yaml:"beta2"`
	AdamEps    float64 `yaml:"adam_eps"`
	GammaPrime float64 `yaml:"gamma_prime"`
	Momentum   float64 `yaml:"momentum"`

	InitSeed     uint64        `yaml:"init_seed"`
	ShardSeed    uint64        `yaml:"shard_seed"`
	RoundTimeout time.Duration `yaml:"round_timeout"`
	EvalEvery    int64         `yaml:"eval_every"`
	MinNodes     int           `yaml:"min_nodes"`
}

// defaultRunSpec is the README's main job: the mlp preset on
// Fashion-MNIST with DP-AdamBC to ε = 3 (δ = 1e-5).
func defaultRunSpec() runSpec {
	opt := dpadam.DefaultConfig()
	return runSpec{
		Run: "fashion-mlp", Model: "mlp", Dataset: "fashion-mnist",
		BatchSize: 256, Clip: 1, TargetEpsilon: 3, Delta: 1e-5, MaxSteps: 1000, Noise: coordinator.DefaultNoiseMode,
		Algorithm: string(opt.Algorithm), LR: opt.LearningRate, Beta1: opt.Beta1, Beta2: opt.Beta2,
		AdamEps: opt.AdamEps, GammaPrime: 1e-6, Momentum: opt.Momentum,
		InitSeed: 1, ShardSeed: 1, RoundTimeout: 10 * time.Second, EvalEvery: 100, MinNodes: 1,
	}
}

// bind registers the run flags on fs, with the spec's current values as
// defaults.
func (s *runSpec) bind(fs *pflag.FlagSet) {
	fs.StringVar(&s.Run, "run", s.Run, "run name (scopes NATS subjects and the ledger)")
	fs.StringVar(&s.Model, "model", s.Model, "model preset: "+strings.Join(model.Presets(), "|"))
	fs.StringVar(&s.ModelSpec, "model-spec", s.ModelSpec, "JSON model spec file (instead of --model)")
	fs.StringVar(&s.Dataset, "dataset", s.Dataset, "training data: fashion-mnist, gaussian or csv")
	fs.StringVar(&s.Data, "data", s.Data, "Fashion-MNIST directory holding its four files (default: search $DPCLUSTER_DATA, the cache and the Debian package's)")
	fs.StringVar(&s.DataPath, "data-path", s.DataPath, "CSV file (label column + features) for --dataset csv: private training data, every row trained on")
	fs.StringVar(&s.EvalPath, "eval-path", s.EvalPath, "csv: separate, public CSV file to evaluate θ on (without it a csv run evaluates nothing)")
	fs.Float64Var(&s.EvalHoldout, "eval-split-from-train", s.EvalHoldout,
		"csv: hold this fraction of --data-path out of training and evaluate on it; the accuracy is NOT differentially private and labelled NON-PRIVATE (nodes need the same value)")
	fs.Int64Var(&s.TotalExamples, "total-examples", s.TotalExamples, "N, training examples across all nodes (default: from the dataset)")
	fs.Float64Var(&s.BatchSize, "batch-size", s.BatchSize, "expected batch size B (q = B/N)")
	fs.Float64Var(&s.Clip, "clip", s.Clip, "per-example clipping norm C")
	fs.Float64Var(&s.Sigma, "sigma", s.Sigma, "noise multiplier σ (0: calibrate to --target-epsilon at --max-steps)")
	fs.StringVar(&s.Noise, "noise", s.Noise, "leader's noise: discrete (exact discrete Gaussian on a fine grid) or float (legacy floating-point sampler, NOT protected against floating-point attacks)")
	fs.StringVar(&s.Accountant, "accountant", s.Accountant, "privacy accountant enforcing the budget and calibrating σ: pld (the default; charges --noise discrete through its lattice) or rdp")
	fs.Float64Var(&s.TargetEpsilon, "target-epsilon", s.TargetEpsilon, "privacy budget ε, enforced by the ledger")
	fs.Float64Var(&s.Delta, "delta", s.Delta, "δ")
	fs.Int64Var(&s.MaxSteps, "max-steps", s.MaxSteps, "stop after this many steps (0: when the budget is spent; needs --sigma)")
	fs.StringVar(&s.Algorithm, "algorithm", s.Algorithm, "optimizer: dp-adambc, dp-adam, dp-sgd or dp-sgdm")
	fs.Float64Var(&s.LR, "lr", s.LR, "learning rate η")
	fs.Float64Var(&s.Beta1, "beta1", s.Beta1, "Adam β1")
	fs.Float64Var(&s.Beta2, "beta2", s.Beta2, "Adam β2")
	fs.Float64Var(&s.AdamEps, "adam-eps", s.AdamEps, "DP-Adam's γ added to sqrt(v̂)")
	fs.Float64Var(&s.GammaPrime, "gamma-prime", s.GammaPrime, "DP-AdamBC's floor γ' under v̂ − Φ")
	fs.Float64Var(&s.Momentum, "momentum", s.Momentum, "DP-SGDM momentum μ")
	fs.Uint64Var(&s.InitSeed, "init-seed", s.InitSeed, "seed of the (public) initial parameters θ₀")
	fs.Uint64Var(&s.ShardSeed, "shard-seed", s.ShardSeed, "seed of the IID split of the training set into node shards")
	fs.DurationVar(&s.RoundTimeout, "round-timeout", s.RoundTimeout, "a round closes after this long with whoever answered")
	fs.Int64Var(&s.EvalEvery, "eval-every", s.EvalEvery, "evaluate on the test split every N steps (0: only at the end)")
	fs.IntVar(&s.MinNodes, "min-nodes", s.MinNodes, "nodes needed before a round opens")
}

// loadRunSpec fills s from the YAML file at path (unknown keys are an
// error), re-applies the flags the user set, so flags win, and checks what
// can be checked without data (check): every command's first step, before
// anything loads.
func loadRunSpec(s *runSpec, path string, fs *pflag.FlagSet) error {
	fileKeys := map[string]bool{}
	if path != "" {
		changed := map[string]string{}
		fs.Visit(func(f *pflag.Flag) { changed[f.Name] = f.Value.String() })
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("run file: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(s); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file
			return fmt.Errorf("run file %s: %w", path, runFileError(err))
		}
		var keys map[string]any
		if err := yaml.Unmarshal(data, &keys); err == nil {
			for k := range keys {
				fileKeys[k] = true
			}
		}
		for name, v := range changed {
			if err := fs.Set(name, v); err != nil {
				return err
			}
		}
		// A preset on the command line wins over the run file's spec, as
		// every flag wins over the file (a spec, when set, is the model).
		if fs.Changed("model") && !fs.Changed("model-spec") {
			s.ModelSpec = ""
		}
	}
	return s.check(fs, fileKeys)
}

// unknownField matches yaml.v3's message for a key KnownFields refused.
var unknownField = regexp.MustCompile(`field (\S+) not found in type \S+`)

// runFileError turns yaml's "field X not found in type cli.runSpec" into
// `unknown key "X"` and lists the keys a run file may hold.
func runFileError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	lines := make([]string, len(te.Errors))
	unknown := false
	for i, e := range te.Errors {
		lines[i] = unknownField.ReplaceAllStringFunc(e, func(m string) string {
			unknown = true
			return fmt.Sprintf("unknown key %q", unknownField.FindStringSubmatch(m)[1])
		})
	}
	msg := strings.Join(lines, "; ")
	if unknown {
		msg += " (a run file's keys: " + strings.Join(runFileKeys(), ", ") + ")"
	}
	return errors.New(msg)
}

// runFileKeys are the keys of runSpec's YAML form, in field order.
func runFileKeys() []string {
	t := reflect.TypeFor[runSpec]()
	var keys []string
	for i := range t.NumField() {
		if k, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); k != "" && k != "-" {
			keys = append(keys, k)
		}
	}
	return keys
}

// check validates what needs no data, so that a mistake is a one-line
// error naming the flag and the value as given before anything loads
// (issue 26): ε is positive and finite; a preset and a spec file are not
// both given in one place (both flags, or both keys of the run file; a
// flag overrides the file's choice); an explicit Fashion-MNIST directory
// holds the data (it is not a hint to search elsewhere). fileKeys are the
// keys the run file set.
func (s *runSpec) check(fs *pflag.FlagSet, fileKeys map[string]bool) error {
	var errs []error
	if !(s.TargetEpsilon > 0) || math.IsInf(s.TargetEpsilon, 0) {
		errs = append(errs, fmt.Errorf("--target-epsilon %v: the privacy budget must be a positive, finite ε", s.TargetEpsilon))
	}
	flags := fs.Changed("model") && fs.Changed("model-spec")
	file := fileKeys["model"] && fileKeys["model_spec"] && !fs.Changed("model") && !fs.Changed("model-spec")
	if flags || file {
		errs = append(errs, fmt.Errorf("--model %s and --model-spec %s: give one of them (a spec file replaces the preset)", s.Model, s.ModelSpec))
	}
	if s.Data != "" && s.Dataset == "fashion-mnist" {
		if err := dataset.CheckFashionMNISTDir(s.Data); err != nil {
			errs = append(errs, fmt.Errorf("--data %s: %w (leave --data out to search $%s, the cache and %s)",
				s.Data, err, dataset.FashionMNISTEnv, dataset.DebianFashionMNISTDir))
		}
	}
	if !(s.BatchSize > 0) || math.IsInf(s.BatchSize, 0) {
		errs = append(errs, fmt.Errorf("--batch-size %v: the expected batch size must be a positive, finite number of examples", s.BatchSize))
	}
	if err := model.CheckClipNorm(s.Clip); err != nil {
		errs = append(errs, fmt.Errorf("--clip %v: must be in [%g, %g]: %w", s.Clip, model.MinClipNorm, model.MaxClipNorm, err))
	}
	if err := s.checkOptimizer(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkDataDirFree refuses, before any data is loaded, a data dir whose
// Raft log another coordinator holds open (a second local or serve on the
// same directory). The replica takes the lock itself later; this only
// says so early and plainly.
func checkDataDirFree(dataDir string) error {
	if err := raftlog.InUse(filepath.Join(dataDir, "raft")); err != nil {
		if errors.Is(err, raftlog.ErrInUse) {
			return fmt.Errorf("--data-dir %s: another coordinator is running on it (its Raft log is locked); stop it, or give another --data-dir", dataDir)
		}
		return fmt.Errorf("--data-dir %s: %w", dataDir, err)
	}
	return nil
}

// optimizer is the spec's optimizer configuration, with σ and B left to
// the run plan (RunPlan fills them in).
func (s *runSpec) optimizer() dpadam.Config {
	opt := dpadam.DefaultConfig()
	opt.Algorithm = dpadam.Algorithm(s.Algorithm)
	opt.LearningRate, opt.Beta1, opt.Beta2, opt.AdamEps = s.LR, s.Beta1, s.Beta2, s.AdamEps
	opt.GammaPrime, opt.Momentum, opt.ClipNorm = s.GammaPrime, s.Momentum, s.Clip
	return opt
}

// checkOptimizer applies the optimizer's own rule (dpadam.Config.Validate)
// to the spec's settings before anything is loaded, and names the flag
// whose value it refuses.
func (s *runSpec) checkOptimizer() error {
	opt := s.optimizer()
	// σ and B are not known yet (σ may be calibrated), and C is checked
	// against the nodes' range above: valid stand-ins leave the check to
	// the optimizer's own settings.
	opt.NoiseMultiplier, opt.ExpectedBatchSize, opt.ClipNorm = 1, 1, 1
	err := opt.Validate()
	if err == nil {
		return nil
	}
	for _, f := range []struct {
		field, flag string
		val         any
	}{
		{"unknown algorithm", "--algorithm", s.Algorithm}, {"LearningRate", "--lr", s.LR},
		{"Beta1", "--beta1", s.Beta1}, {"Beta2", "--beta2", s.Beta2}, {"AdamEps", "--adam-eps", s.AdamEps},
		{"GammaPrime", "--gamma-prime", s.GammaPrime}, {"Momentum", "--momentum", s.Momentum},
	} {
		if strings.Contains(err.Error(), f.field) {
			return fmt.Errorf("%s %v: %w", f.flag, f.val, err)
		}
	}
	return fmt.Errorf("optimizer settings: %w", err)
}

// dataOptions are the spec's data choices as dataset.LoadRun takes them.
func (s *runSpec) dataOptions(m *model.Model, log *slog.Logger) dataset.RunOptions {
	return dataset.RunOptions{
		Dataset: s.Dataset, Dir: s.Data, Path: s.DataPath, EvalPath: s.EvalPath, EvalHoldout: s.EvalHoldout,
		Model: m, Log: log,
	}
}

// loadData loads the training set and the evaluation set with the loader
// every node uses (dataset.LoadRun), so that the coordinator's N is the
// total of the nodes' shards.
func (s *runSpec) loadData(ctx context.Context, m *model.Model, log *slog.Logger) (*dataset.Dataset, dataset.EvalSet, error) {
	return dataset.LoadRun(ctx, s.dataOptions(m, log))
}

// evalKind is how the coordinator labels evaluations on eval.
func evalKind(eval dataset.EvalSet) coordinator.EvalData {
	if eval.Holdout {
		return coordinator.EvalTrainHoldout
	}
	return coordinator.EvalPublic
}

// runConfig turns the spec into the replicated run configuration
// (coordinator.RunPlan.RunConfig derives N, q = B/N, σ and the seed
// policy); n is the loaded data's size (0: none). With a dataDir (a
// replica's) a calibrated σ is remembered there and reused by the next
// start (RunPlan.RunConfigCached).
func (s *runSpec) runConfig(m *model.Model, n int64, seeded bool, dataDir string, log *slog.Logger) (coordinator.RunConfig, error) {
	// Nodes clip only within model.CheckClipNorm's range (outside it the
	// float error analysis no longer holds), so they would skip every
	// round of a run configured outside it: refuse it here, at start.
	if err := model.CheckClipNorm(s.Clip); err != nil {
		return coordinator.RunConfig{}, fmt.Errorf("--clip %v: must be in [%g, %g]: %w", s.Clip, model.MinClipNorm, model.MaxClipNorm, err)
	}
	specJSON, err := m.Spec().CanonicalJSON()
	if err != nil {
		return coordinator.RunConfig{}, err
	}
	opt := s.optimizer()
	return coordinator.RunPlan{
		Run: s.Run, ModelSpec: specJSON, ModelHash: m.Hash(), Dim: m.NumParams(), InitSeed: s.InitSeed,
		DataExamples: n, TotalExamples: s.TotalExamples, BatchSize: s.BatchSize, Sigma: s.Sigma,
		TargetEpsilon: s.TargetEpsilon, Delta: s.Delta, MaxSteps: s.MaxSteps, Optimizer: opt,
		NoiseMode: s.Noise, KeepLegacyNoise: s.legacyNoise, Seeded: seeded,
		Accountant: s.Accountant, KeepLegacyAccountant: s.legacyAccountant,
	}.RunConfigCached(dataDir, log)
}

// keepLegacyNoise makes a run that was configured before noise modes
// existed resume as it started: if dataDir's ledger has a run record that
// names no mechanism, that run used the floating-point sampler and its
// configuration entry has no noise mode, so the spec gets the legacy mode
// (RunConfig.NoiseMode NoiseLegacy) whatever --noise says, since a run
// cannot change mechanism midway, and a warning says so. Anything else
// leaves the spec alone; a missing or unreadable ledger is the replica's
// to report.
func (s *runSpec) keepLegacyNoise(dataDir string, log *slog.Logger) {
	recs, _, err := ledger.ReadFile(filepath.Join(dataDir, coordinator.LedgerFile))
	if err != nil || len(recs) == 0 || recs[0].Kind != ledger.RecordRun || recs[0].Mechanism != "" {
		return
	}
	log.Warn("resuming a run configured before noise modes: it keeps the legacy floating-point sampler, which is NOT protected against floating-point attacks",
		"run", recs[0].Run, "data_dir", dataDir)
	s.legacyNoise = true
}

// keepLegacyAccountant makes a run that was configured before accountants
// were recorded resume as it started: if dataDir's ledger has a run record
// that names no accountant, that run enforced its budget with RDP and its
// configuration entry names no accountant, so the spec gets the legacy
// accountant (RunConfig.Accountant AccountantLegacy, RDP) whatever
// --accountant says, since a run cannot change accountant midway, and a
// warning says so when --accountant asked for another. Anything else
// leaves the spec alone.
func (s *runSpec) keepLegacyAccountant(dataDir string, log *slog.Logger) {
	recs, _, err := ledger.ReadFile(filepath.Join(dataDir, coordinator.LedgerFile))
	if err != nil || len(recs) == 0 || recs[0].Kind != ledger.RecordRun || recs[0].Accountant != "" {
		return
	}
	if s.Accountant != "" && s.Accountant != coordinator.AccountantRDP {
		log.Warn("resuming a run configured before accountants were recorded: it keeps the RDP accountant it started with",
			"run", recs[0].Run, "data_dir", dataDir, "asked_for", s.Accountant)
	}
	s.legacyAccountant = true
}

// accountantName names a run's accountant for output (RDP for a run
// configured before accountants were recorded).
func accountantName(a string) string {
	if a == coordinator.AccountantLegacy {
		return coordinator.AccountantRDP
	}
	return a
}

// noiseModeName names a run's noise mode for output.
func noiseModeName(mode string) string {
	if mode == coordinator.NoiseLegacy {
		return "float (legacy)"
	}
	return mode
}

// preparedRun is a run ready to start: its model, data and replicated
// configuration.
type preparedRun struct {
	model *model.Model
	train *dataset.Dataset // nil with --dataset none
	eval  dataset.EvalSet  // no Data with --dataset none or a csv run without evaluation data
	cfg   coordinator.RunConfig
}

// prepare builds the model, loads the data (unless the dataset is "none",
// which serve allows: N then comes from --total-examples and nothing is
// evaluated) and derives the run configuration, remembering a calibrated
// σ in dataDir if it is not "" (a replica's data directory).
func (s *runSpec) prepare(ctx context.Context, seeded bool, dataDir string, log *slog.Logger) (preparedRun, error) {
	var pr preparedRun
	var err error
	if pr.model, err = loadModel(s.Model, s.ModelSpec); err != nil {
		return pr, err
	}
	var n int64
	if s.Dataset != "none" {
		if pr.train, pr.eval, err = s.loadData(ctx, pr.model, log); err != nil {
			return pr, err
		}
		n = int64(pr.train.Len())
		tuneGC(log, dataBytes(pr.train, pr.eval.Data))
	}
	pr.cfg, err = s.runConfig(pr.model, n, seeded, dataDir, log)
	return pr, err
}

// serverConfig is the round loop's configuration from the spec.
func (s *runSpec) serverConfig() coordinator.ServerConfig {
	sc := coordinator.DefaultServerConfig()
	sc.RoundTimeout, sc.EvalEvery, sc.MinNodes = s.RoundTimeout, s.EvalEvery, s.MinNodes
	return sc
}

// modelEvaluator evaluates θ on the evaluation set.
type modelEvaluator struct {
	ws   *model.Workspace
	test *dataset.Dataset
}

func newModelEvaluator(m *model.Model, test *dataset.Dataset) (*modelEvaluator, error) {
	if err := m.CheckDataset(test); err != nil {
		return nil, err
	}
	ws, err := m.NewWorkspace(512)
	if err != nil {
		return nil, err
	}
	return &modelEvaluator{ws: ws, test: test}, nil
}

// Evaluate adapts the model's evaluation to the coordinator's type.
func (e *modelEvaluator) Evaluate(theta []float32) (coordinator.Evaluation, error) {
	ev, err := e.ws.EvaluateDataset(theta, e.test)
	if err != nil {
		return coordinator.Evaluation{}, err
	}
	return coordinator.Evaluation{Loss: ev.Loss, Accuracy: ev.Accuracy, N: ev.N}, nil
}

// evalLabel is eval's label (coordinator.EvalData.Label), or "none".
func evalLabel(eval dataset.EvalSet) string {
	if eval.Data == nil {
		return "none"
	}
	return evalKind(eval).Label()
}

// evalSummary is the line `local` and `serve` print about the final
// evaluation, labelled by its data (coordinator.EvalData): empty when this
// replica has none to report (a follower, a failed evaluation).
func evalSummary(eval dataset.EvalSet, sum coordinator.Summary) string {
	if eval.Data == nil {
		return "no evaluation: no evaluation data (a csv run evaluates on a separate public file: --eval-path FILE)"
	}
	if !sum.FinalEvaluated {
		return ""
	}
	d := sum.EvalData
	return fmt.Sprintf("%s accuracy %.2f%% (loss %.4f) on %d %s", d.Label(), 100*sum.Final.Accuracy, sum.Final.Loss, sum.Final.N, d.Examples())
}

// modelInit is the replicas' θ₀: the run's model spec, initialized from
// its seed. Deterministic, as coordinator.InitFunc requires.
func modelInit(c coordinator.RunConfig) ([]float32, error) {
	spec, err := model.ParseSpec(c.ModelSpec)
	if err != nil {
		return nil, err
	}
	m, err := model.New(spec)
	if err != nil {
		return nil, err
	}
	if m.Hash() != c.ModelHash {
		return nil, fmt.Errorf("model spec hashes to %s, run says %s", m.Hash(), c.ModelHash)
	}
	theta := make([]float32, m.NumParams())
	return theta, m.Init(theta, c.InitSeed)
}

// newLogger returns the command's slog logger on stderr.
func newLogger(cmd *cobra.Command, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"slices"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/model"
)

// dataOptions are the spec's data choices as dataset.LoadRun takes them.
// A nil m leaves the options' Model nil (no typed nil in the interface).
func (s *runSpec) dataOptions(m *model.Model, log *slog.Logger) dataset.RunOptions {
	o := dataset.RunOptions{
		Dataset: s.Dataset, Dir: s.Data, Path: s.DataPath, EvalPath: s.EvalPath, EvalHoldout: s.EvalHoldout,
		File: s.fileOptions(), Log: log,
	}
	if m != nil {
		o.Model = m
	}
	return o
}

// fileOptions say how a data file is read (dataset.ReadFile).
func (s *runSpec) fileOptions() dataset.FileOptions {
	return dataset.FileOptions{
		LabelColumn: s.LabelColumn, FeatureColumns: s.FeatureColumns, Labels: s.Labels, Classes: s.Classes,
		InputShape: s.InputShape, SeqLen: s.SeqLen, Vocab: s.Vocab, TextColumn: s.TextColumn, TextPairColumn: s.TextPairColumn,
		Tokenizer: s.Tokenizer,
	}
}

// schema is the run's data schema for a run whose nodes bring their own
// data: the run file's input_shape, classes and labels.
func (s *runSpec) schema() (dataset.Schema, error) {
	sc := dataset.Schema{Shape: s.InputShape, Classes: s.Classes, Labels: s.Labels, Vocab: s.Vocab}
	if sc.Classes == 0 {
		sc.Classes = len(s.Labels)
	}
	if err := sc.Validate(); err != nil {
		return sc, fmt.Errorf("the run file's data schema (input_shape, classes, labels): %w", err)
	}
	return sc, nil
}

// modelFor builds the run's model for data of the given input shape,
// classes and vocabulary: the preset shaped by them (model.PresetFor), or
// the spec file, which must fit them. A nil shape means no data is known
// (serve without data): the preset's own shape.
func (s *runSpec) modelFor(shape []int, classes, vocab int) (*model.Model, error) {
	if s.InitFrom != "" {
		if shape == nil {
			return nil, fmt.Errorf("--init-from %s needs the run's data (or, for --dataset local, its input_shape and classes) to shape the model's head", s.InitFrom)
		}
		return s.pretrainedModel(shape, classes, vocab)
	}
	if s.ModelSpec != "" {
		m, err := loadModel("", s.ModelSpec)
		if err != nil || shape == nil {
			return m, err
		}
		if !slices.Equal(m.InputShape(), shape) || m.Classes() != classes {
			return nil, fmt.Errorf("--model-spec %s takes input shape %v and %d classes; the data has shape %v and %d classes "+
				"(write a spec for the data: examples/models/ has some, or use a preset, which takes the data's shape)",
				s.ModelSpec, m.InputShape(), m.Classes(), shape, classes)
		}
		return m, nil
	}
	if shape == nil {
		return loadModel(s.Model, "")
	}
	spec, err := model.PresetFor(s.Model, shape, classes, vocab)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	return model.New(spec)
}

// evalKind is how the coordinator labels evaluations on eval.
func evalKind(eval dataset.EvalSet) coordinator.EvalData {
	if eval.Holdout {
		return coordinator.EvalTrainHoldout
	}
	return coordinator.EvalPublic
}

// weakEpsilon is the target ε above which a run is warned that its
// guarantee is weak.
const weakEpsilon = 10

// runConfig turns the spec into the replicated run configuration
// (coordinator.RunPlan.RunConfig derives N, q = B/N, σ and the seed
// policy); n is the loaded data's size (0: none), schema the run's data
// schema when its nodes bring their own data (else ""). With a dataDir (a
// replica's) a calibrated σ is remembered there and reused by the next
// start (RunPlan.RunConfigCached). A node's spec (forNode) gets the node's
// configuration instead, σ not calibrated (RunPlan.NodeConfig).
func (s *runSpec) runConfig(m *model.Model, n int64, schema string, seeded bool, dataDir string, log *slog.Logger) (coordinator.RunConfig, error) {
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
	plan := coordinator.RunPlan{
		Run: s.Run, ModelSpec: specJSON, ModelHash: m.Hash(), Dim: m.NumParams(), InitSeed: s.InitSeed,
		DataExamples: n, TotalExamples: s.TotalExamples, BatchSize: s.BatchSize, Sigma: s.Sigma,
		TargetEpsilon: s.TargetEpsilon, Delta: s.Delta, LedgerDelta: s.ledgerDelta, MaxSteps: s.MaxSteps, Optimizer: opt,
		NoiseMode: s.Noise, KeepLegacyNoise: s.legacyNoise, Seeded: seeded,
		Accountant: s.Accountant, KeepLegacyAccountant: s.legacyAccountant, DataSchema: schema, Nodes: s.Nodes,
		Pretrained: s.pretrained, Names: s.names,
	}
	if s.forNode {
		return plan.NodeConfig()
	}
	if s.TargetEpsilon > weakEpsilon {
		log.Warn(fmt.Sprintf("target ε = %g is above %g: the guarantee bounds little (an attacker's odds of telling whether any one example was used may grow by a factor up to e^ε = %.3g); ε of 1 to 8 is the usual range",
			s.TargetEpsilon, float64(weakEpsilon), math.Exp(s.TargetEpsilon)))
	}
	return plan.RunConfigCached(dataDir, log)
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

// keepLedgerDelta makes a resumed run keep its δ: if dataDir's ledger has
// a run record, its δ is the plan's LedgerDelta, which the run keeps
// unless --delta (or the run file) gives one. A run started with the
// fixed default δ = 1e-5 and N ≥ 1e5 thus resumes, where the derived
// default (coordinator.DefaultDelta) would not match its ledger.
func (s *runSpec) keepLedgerDelta(dataDir string) {
	recs, _, err := ledger.ReadFile(filepath.Join(dataDir, coordinator.LedgerFile))
	if err != nil || len(recs) == 0 || recs[0].Kind != ledger.RecordRun {
		return
	}
	s.ledgerDelta = recs[0].Delta
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

// prepare builds the model, loads the data and derives the run
// configuration, remembering a calibrated σ in dataDir if it is not "" (a
// replica's data directory). The model is shaped by the data: a file's
// shape and classes (the data is loaded first), Fashion-MNIST's, or, for a
// run whose nodes bring their own data, the run's schema. With dataset
// none (serve only) or local nothing is loaded here: N then comes from
// total_examples and nothing but an eval_path is evaluated.
func (s *runSpec) prepare(ctx context.Context, seeded bool, dataDir string, log *slog.Logger) (preparedRun, error) {
	var pr preparedRun
	var err error
	var n int64
	var schema string
	switch s.Dataset {
	case "none":
		if pr.model, err = s.modelFor(nil, 0, 0); err != nil {
			return pr, err
		}
	case dataset.NameLocal:
		sc, err := s.schema()
		if err != nil {
			return pr, err
		}
		schema = sc.String()
		s.names = s.dataNames(sc.Labels, s.FeatureColumns)
		if pr.model, err = s.modelFor(sc.Shape, sc.Classes, sc.Vocab); err != nil {
			return pr, err
		}
		if s.EvalPath != "" {
			if pr.eval.Data, err = s.readLocal(s.EvalPath, sc); err != nil {
				return pr, fmt.Errorf("--eval-path: %w", err)
			}
		}
	case dataset.NameFile, dataset.NameCSV, dataset.NameFortunesCategory:
		if pr.train, pr.eval, err = dataset.LoadRun(ctx, s.dataOptions(nil, log)); err != nil {
			if f, _ := dataset.FormatOf(s.DataPath); f == dataset.FormatCSV && s.LabelColumn == "" && errors.Is(err, dataset.ErrCSV) {
				err = fmt.Errorf("%w (without --label-column a CSV file has no header and its label in the first column; "+
					"a file with a header: --label-column NAME)", err)
			}
			return pr, err
		}
		sc := dataset.SchemaOf(pr.train)
		if pr.model, err = s.modelFor(sc.Shape, sc.Classes, sc.Vocab); err != nil {
			return pr, err
		}
		if ev := pr.eval.Data; ev != nil && !pr.eval.Holdout {
			if err := pr.model.CheckDataset(ev); err != nil {
				return pr, fmt.Errorf("--eval-path %s does not fit the model the training data shapes: %w", s.EvalPath, err)
			}
		}
	default:
		if pr.model, err = s.modelFor(nil, 0, 0); err != nil {
			return pr, err
		}
		// A σ that cannot reach max_steps within the budget is refused
		// before the data loads, where N is known in advance; so is any
		// bad plan where deriving it is cheap: σ given, or a node's plan
		// (which calibrates no σ).
		if n0 := dataset.KnownTrainSize(s.Dataset); n0 > 0 && (s.Sigma > 0 || s.forNode) && s.MaxSteps > 0 {
			c, err := s.runConfig(pr.model, n0, "", seeded, "", log)
			if err == nil {
				err = s.checkPlannedBudget(c)
			}
			if err != nil {
				return pr, err
			}
		}
		if pr.train, pr.eval, err = dataset.LoadRun(ctx, s.dataOptions(pr.model, log)); err != nil {
			return pr, err
		}
	}
	if pr.train != nil {
		s.names = s.dataNames(pr.train.LabelNames, pr.train.FeatureNames)
		n = int64(pr.train.Len())
		tuneGC(log, dataBytes(pr.train, pr.eval.Data))
	}
	pr.cfg, err = s.runConfig(pr.model, n, schema, seeded, dataDir, log)
	return pr, err
}

// dataNames are the names the run configuration records for the model's
// users (coordinator.RunConfig.Names): the class names and feature columns
// given (the training data's, or the run file's for node-local data) and
// the spec's label and text columns; nil when there are none.
func (s *runSpec) dataNames(classes, features []string) *coordinator.DataNames {
	n := coordinator.DataNames{Classes: slices.Clone(classes), Features: slices.Clone(features),
		TextColumn: s.TextColumn, TextPairColumn: s.TextPairColumn}
	if n.Features != nil || n.TextColumn != "" {
		n.LabelColumn = s.LabelColumn // a column of a file with a header
	}
	if n.Classes == nil && n.Features == nil && n.TextColumn == "" {
		return nil
	}
	return &n
}

// readLocal reads a data file of a run whose nodes bring their own data
// (a node's own file, or the replicas' public evaluation file) and checks
// it against the run's schema: the class names map to the run's classes,
// and images are resized to the run's input shape.
func (s *runSpec) readLocal(path string, sc dataset.Schema) (*dataset.Dataset, error) {
	fo := s.fileOptions()
	fo.Labels, fo.Classes, fo.Vocab = sc.Labels, sc.Classes, sc.Vocab
	// Labels by name or by number alike: with the run's class names an
	// integer label indexes them, and with only a class count a string
	// label is a class number (dataset.FileOptions).
	fo.IndexLabels = sc.Labels == nil
	if f, _ := dataset.FormatOf(path); f != dataset.FormatImageFolder && f != dataset.FormatTextFolder {
		// The data says its shape; the schema check compares it. Images
		// are resized, and text cut, to the run's.
		fo.InputShape = nil
	}
	d, err := dataset.ReadFile(path, fo)
	if err != nil {
		return nil, err
	}
	if err := sc.Check(d); err != nil {
		return nil, fmt.Errorf("%s: %w (the run file's input_shape, classes and labels say what every node's data must be)", path, err)
	}
	return d, nil
}

// checkPlannedBudget refuses, before training, a run whose given σ would
// spend more than the budget before max_steps: the ledger would stop it
// early, which the user did not ask for. With σ calibrated, or no step
// limit (train until the budget is spent), there is nothing to check.
func (s *runSpec) checkPlannedBudget(c coordinator.RunConfig) error {
	if s.Sigma == 0 || c.MaxSteps == 0 {
		return nil
	}
	eps, err := c.PlannedEpsilon()
	if err != nil {
		return err
	}
	if eps > c.TargetEpsilon {
		return fmt.Errorf("--sigma %g spends ε = %.4g over --max-steps %d, more than --target-epsilon %g: the ledger would stop the run early; "+
			"raise --sigma, lower --max-steps, raise the budget, or leave --sigma out to calibrate it", s.Sigma, eps, c.MaxSteps, c.TargetEpsilon)
	}
	return nil
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
	return coordinator.Evaluation{Loss: ev.Loss, Accuracy: ev.Accuracy, N: ev.N, Tokens: ev.Tokens}, nil
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
		return "no evaluation: no evaluation data (a data-file run evaluates on a separate public file: --eval-path FILE)"
	}
	if !sum.FinalEvaluated {
		return ""
	}
	d, m := sum.EvalData, sum.Final
	if m.Tokens > 0 { // a next-token model: per token
		return fmt.Sprintf("%s perplexity %.2f (loss %.4f nats per token, next-token accuracy %.2f%%) over %d tokens of %d %s",
			d.Label(), m.Perplexity(), m.Loss, 100*m.Accuracy, m.Tokens, m.N, d.Examples())
	}
	return fmt.Sprintf("%s accuracy %.2f%% (loss %.4f) on %d %s", d.Label(), 100*m.Accuracy, m.Loss, m.N, d.Examples())
}

// modelInit is the replicas' θ₀: the run's model built from its spec,
// initialized from its seed (coordinator.RunConfig.Theta0).
var modelInit = coordinator.InitFromSpec(func(spec []byte) (coordinator.Initializer, error) {
	s, err := model.ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	m, err := model.New(s)
	if err != nil {
		return nil, err // no typed nil in the interface
	}
	return m, nil
})

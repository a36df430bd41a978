package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/raftlog"
	"github.com/dpcluster/dpcluster/transport"
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
	// mixture shaped by the model), file (csv is the same: a data file in
	// any format dataset.ReadFile reads, cut into IID shards), local (each
	// node brings its own data file; the replicas load none), or, for
	// serve only, none. Except with local, the nodes load the same data as
	// the replicas (they all use dataset.LoadRun) and take IID shards.
	Dataset  string `yaml:"dataset"`
	Data     string `yaml:"data"`      // fashion-mnist: directory searched first
	DataPath string `yaml:"data_path"` // file: the (private) training file; local: the node's own
	// LabelColumn, FeatureColumns, Labels, Classes and InputShape say how
	// a data file is read (dataset.FileOptions) and, for dataset local,
	// what every node's data must look like (the run's dataset.Schema:
	// InputShape and Classes or Labels). Labels are the class names in
	// class order.
	LabelColumn    string   `yaml:"label_column"`
	FeatureColumns []string `yaml:"feature_columns"`
	Labels         []string `yaml:"labels"`
	Classes        int      `yaml:"classes"`
	InputShape     []int    `yaml:"input_shape"`
	// SeqLen and Vocab tokenize a folder of text documents per class
	// (dataset.HashTokenizer): tokens kept per document and the number of
	// token ids; for dataset local, vocab is part of the run's schema.
	SeqLen int `yaml:"seq_len"`
	Vocab  int `yaml:"vocab"`
	// TextColumn and TextPairColumn name a CSV or Parquet file's text
	// column (and a second text, for pairs), tokenized like a text folder,
	// instead of numeric feature columns (dataset.FileOptions).
	TextColumn     string `yaml:"text_column"`
	TextPairColumn string `yaml:"text_pair_column"`
	// Tokenizer is a pretrained checkpoint's folder whose tokenizer
	// (vocab.txt, or vocab.json and merges.txt) tokenizes the text
	// instead of the hashing tokenizer (dataset.LoadPretrainedTokenizer).
	Tokenizer string `yaml:"tokenizer"`
	// InitFrom is a pretrained checkpoint's folder (config.json,
	// model.safetensors): the model is its architecture with a
	// classification head for the data, θ₀ its weights
	// (package pretrained), and Tokenizer defaults to it.
	InitFrom string `yaml:"init_from"`
	// Trainable and Freeze choose what trains in a run that starts from a
	// checkpoint (model.Spec.Trainable and Freeze: path.Match patterns
	// over the engine's parameter names, a layer whole or not at all);
	// the other layers stay at the checkpoint's values and never leave
	// the process that holds them. Neither: everything trains.
	Trainable []string `yaml:"trainable"`
	Freeze    []string `yaml:"freeze"`
	// LoRA adds low-rank adapters to a --init-from checkpoint's layers
	// (pretrained.WithLoRA): with a rank, only the adapters train, and
	// what Trainable names besides (the head, usually).
	LoRA loraSpec `yaml:"lora"`
	// pretrained is set by modelFor for a run with InitFrom: the weights'
	// hash and config.json the run configuration records.
	pretrained *coordinator.Pretrained
	// names is set by prepare from the data (dataNames): the class and
	// column names the run configuration records for the model's users.
	names *coordinator.DataNames
	// Nodes, if set, are the run's node IDs, each bound to its shard:
	// nodes[i] holds shard i of len(nodes) (coordinator.RunConfig.Nodes);
	// a node then takes its --shard-index and --shard-count from the list.
	Nodes []string `yaml:"node_ids"`
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
	// Delta is δ, below 1/N; 0 derives it (coordinator.RunPlan: the
	// resumed run's ledger's, else coordinator.DefaultDelta(N)).
	Delta    float64 `yaml:"delta"`
	MaxSteps int64   `yaml:"max_steps"`
	// ledgerDelta is set by keepLedgerDelta, never by the user.
	ledgerDelta float64

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
	// forNode says the spec is a node's: it derives the node's
	// configuration (coordinator.RunPlan.NodeConfig: q and C, never σ,
	// which is the leader's). Set by loadNodeShard, never by the user.
	forNode bool

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
	// MinNodes is how many live nodes a round needs; when not given, the
	// number of Nodes if set (every named node), else 1.
	MinNodes int `yaml:"min_nodes"`
	// minNodesGiven says MinNodes was given (key or flag); set by
	// loadRunSpec, never by the user.
	minNodesGiven bool
}

// defaultRunSpec is the README's main job: the mlp preset on
// Fashion-MNIST with DP-AdamBC to ε = 3 (δ = 1e-5).
func defaultRunSpec() runSpec {
	opt := dpadam.DefaultConfig()
	return runSpec{
		Run: "fashion-mlp", Model: "mlp", Dataset: "fashion-mnist",
		BatchSize: 256, Clip: 1, TargetEpsilon: 3, MaxSteps: 1000, Noise: coordinator.DefaultNoiseMode,
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
	fs.StringVar(&s.Dataset, "dataset", s.Dataset, "training data: fashion-mnist, gaussian, fortunes-seq (next-token windows of the Debian fortunes, for --model transformer), fortunes-category (each Debian fortune labelled by its category, for --model textbag), file (csv), or local (each node its own --data-path); --data-path alone means file")
	fs.StringVar(&s.Data, "data", s.Data, "Fashion-MNIST directory holding its four files (default: search $DPCLUSTER_DATA, the cache and the Debian package's); for fortunes-seq and fortunes-category, the fortune files' directory (default /usr/share/games/fortunes)")
	fs.StringVar(&s.DataPath, "data-path", s.DataPath, "private training data: a .csv, .npy, .npz or .parquet file, or a folder of images or .txt documents per class "+
		"(docs/DATA.md); with --dataset local, this node's own file")
	fs.StringVar(&s.LabelColumn, "label-column", s.LabelColumn, "CSV (with a header) or Parquet: the label column's name (CSV without it: no header, label first)")
	fs.StringSliceVar(&s.FeatureColumns, "feature-columns", s.FeatureColumns, "CSV or Parquet: the feature columns by name, in order (default: every column but the label)")
	fs.StringSliceVar(&s.Labels, "labels", s.Labels, "the class names in class order (default: integer labels, or the sorted names the data holds)")
	fs.IntVar(&s.Classes, "classes", s.Classes, "number of classes (default: from the labels)")
	fs.IntSliceVar(&s.InputShape, "input-shape", s.InputShape, "per-example input shape, e.g. 3,32,32: the size images are resized to (default: the first image's); with --dataset local, the run's")
	fs.StringSliceVar(&s.Trainable, "trainable", s.Trainable, "with --init-from: the parameters that train, as patterns over their names (layer.11.*,pooler.*,classifier.*: the last block and the head); the rest stays frozen at the checkpoint's values")
	fs.IntVar(&s.LoRA.Rank, "lora-rank", s.LoRA.Rank, "with --init-from: LoRA adapters of this rank on --lora-targets; only they train, and what --trainable names (the head: classifier.*, score.*)")
	fs.Float64Var(&s.LoRA.Alpha, "lora-alpha", s.LoRA.Alpha, "LoRA's alpha: the adapters' output is scaled by alpha/rank (default: the rank, a scale of 1)")
	fs.StringSliceVar(&s.LoRA.Targets, "lora-targets", s.LoRA.Targets, "the layers that get adapters, named as PEFT's target_modules (BERT: query, key, value, attention.output, intermediate, output; GPT-2: c_attn, c_proj, c_fc; default BERT's query,value and GPT-2's c_attn)")
	fs.StringSliceVar(&s.Freeze, "freeze", s.Freeze, "with --init-from: the parameters that do not train, as patterns over their names (embeddings.*), after --trainable")
	fs.StringSliceVar(&s.Nodes, "node-ids", s.Nodes, "the run's node IDs, each bound to its shard (the i-th holds shard i of their number); no other node is admitted")
	fs.IntVar(&s.SeqLen, "seq-len", s.SeqLen, "text folders and text columns: tokens kept per document (default: --input-shape's, else 128)")
	fs.IntVar(&s.Vocab, "vocab", s.Vocab, "text folders and text columns: token ids of the hashing tokenizer (default 16384)")
	fs.StringVar(&s.TextColumn, "text-column", s.TextColumn, "CSV with a header (--label-column) or Parquet: the text column, tokenized like a text folder (--seq-len, --vocab, --tokenizer), instead of numeric features")
	fs.StringVar(&s.TextPairColumn, "text-pair-column", s.TextPairColumn, "with --text-column: a second text column; each example is the pair")
	fs.StringVar(&s.Tokenizer, "tokenizer", s.Tokenizer, "text: a pretrained checkpoint's folder whose own tokenizer (vocab.txt: BERT's WordPiece; vocab.json and merges.txt: GPT-2's BPE) tokenizes the text instead of the hashing tokenizer")
	fs.StringVar(&s.InitFrom, "init-from", s.InitFrom, "a pretrained checkpoint's folder (config.json and model.safetensors as Hugging Face's save_pretrained writes them: BERT or GPT-2): fine-tune it with a classification head for the data; its tokenizer tokenizes the text unless --tokenizer says otherwise")
	fs.StringVar(&s.EvalPath, "eval-path", s.EvalPath, "file: separate, public data file to evaluate θ on, read like --data-path (without it a file run evaluates nothing)")
	fs.Float64Var(&s.EvalHoldout, "eval-split-from-train", s.EvalHoldout,
		"file: hold this fraction of --data-path out of training and evaluate on it; the accuracy is NOT differentially private and labelled NON-PRIVATE (nodes need the same value)")
	fs.Int64Var(&s.TotalExamples, "total-examples", s.TotalExamples, "N, training examples across all nodes (default: from the dataset)")
	fs.Float64Var(&s.BatchSize, "batch-size", s.BatchSize, "expected batch size B (q = B/N)")
	fs.Float64Var(&s.Clip, "clip", s.Clip, "per-example clipping norm C")
	fs.Float64Var(&s.Sigma, "sigma", s.Sigma, "noise multiplier σ (0: calibrate to --target-epsilon at --max-steps)")
	fs.StringVar(&s.Noise, "noise", s.Noise, "leader's noise: discrete (exact discrete Gaussian on a fine grid) or float (legacy floating-point sampler, NOT protected against floating-point attacks)")
	fs.StringVar(&s.Accountant, "accountant", s.Accountant, "privacy accountant enforcing the budget and calibrating σ: pld (the default; charges --noise discrete through its lattice) or rdp")
	fs.Float64Var(&s.TargetEpsilon, "target-epsilon", s.TargetEpsilon, "privacy budget ε, enforced by the ledger")
	fs.Float64Var(&s.Delta, "delta", s.Delta, "δ, below 1/N (0: 1e-5 for N < 1e5, else the largest power of ten ≤ 1/(10·N); a resumed run keeps its ledger's)")
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
		// The flags the user set, to re-apply after the file: a list flag
		// (pflag.SliceValue) by its items, since Set on a list flag already
		// set appends, and its String form ("[a,b]") is no value to set.
		changed := map[string]string{}
		lists := map[string][]string{}
		fs.Visit(func(f *pflag.Flag) {
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				lists[f.Name] = sv.GetSlice()
				return
			}
			changed[f.Name] = f.Value.String()
		})
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
		for name, v := range lists {
			if err := fs.Lookup(name).Value.(pflag.SliceValue).Replace(v); err != nil {
				return err
			}
		}
		// A preset on the command line wins over the run file's spec, as
		// every flag wins over the file (a spec, when set, is the model).
		if fs.Changed("model") && !fs.Changed("model-spec") {
			s.ModelSpec = ""
		}
	}
	given := func(flag, key string) bool { return fs.Changed(flag) || fileKeys[key] }
	// A data file alone says what to train on: --data-path x.csv is
	// --dataset file.
	if s.DataPath != "" && !given("dataset", "dataset") {
		s.Dataset = dataset.NameFile
	}
	if !given("run", "run") {
		s.Run = s.derivedRunName()
	}
	s.minNodesGiven = given("min-nodes", "min_nodes")
	if !s.minNodesGiven && len(s.Nodes) > 0 {
		s.MinNodes = len(s.Nodes)
	}
	return s.check(fs, fileKeys)
}

// derivedRunName is the run name when none is given: the data's and the
// model's names ("fashion-mlp", "patients-mlp" for --data-path
// patients.csv, "gaussian-cnn", "fortunes-category-bert-base-uncased" for
// --init-from bert-base-uncased), with every character a run name does not
// allow replaced by '-'. A run whose nodes bring their own data has no
// name to derive (check requires one); serve without data keeps the
// default.
func (s *runSpec) derivedRunName() string {
	mdl := s.modelName()
	var data string
	switch s.Dataset {
	case dataset.NameFashionMNIST:
		data = "fashion"
	case dataset.NameGaussian:
		data = "gaussian"
	case dataset.NameFortunesSeq:
		data = "fortunes"
	case dataset.NameFortunesCategory:
		data = "fortunes-category"
	case dataset.NameCSV, dataset.NameFile:
		base := filepath.Base(filepath.Clean(s.DataPath))
		data = strings.TrimSuffix(base, filepath.Ext(base))
	default:
		return s.Run
	}
	name := []byte(data + "-" + mdl)
	for i, c := range name {
		if !transport.ValidRunName(string(c)) {
			name[i] = '-'
		}
	}
	return string(name[:min(len(name), 64)])
}

// modelName names the run's model: the preset, the spec file's name, or
// the pretrained checkpoint's folder.
func (s *runSpec) modelName() string {
	switch {
	case s.ModelSpec != "":
		return strings.TrimSuffix(filepath.Base(s.ModelSpec), filepath.Ext(s.ModelSpec))
	case s.InitFrom != "":
		return filepath.Base(filepath.Clean(s.InitFrom))
	}
	return s.Model
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
	if len(s.Nodes) > 0 && s.MinNodes > len(s.Nodes) {
		errs = append(errs, fmt.Errorf("--min-nodes %d: the run admits only the %d nodes of node_ids, so no round could open; give at most %d",
			s.MinNodes, len(s.Nodes), len(s.Nodes)))
	}
	errs = append(errs, s.checkData(fs.Changed("run") || fileKeys["run"])...)
	if err := s.checkInitFrom(fs, fileKeys); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// runDatasets are the values of --dataset.
var runDatasets = []string{dataset.NameFashionMNIST, dataset.NameGaussian, dataset.NameFortunesSeq, dataset.NameFortunesCategory, dataset.NameFile, dataset.NameCSV, dataset.NameLocal, "none"}

// checkData checks the data options before anything is read: a known
// dataset; for a data file, that it exists in a format the loader reads;
// the class names agreeing with the class count; and, for a run whose
// nodes bring their own data, everything the replicas need in advance
// (a run name, the schema, N). runNamed says the run name was given.
func (s *runSpec) checkData(runNamed bool) []error {
	var errs []error
	if !slices.Contains(runDatasets, s.Dataset) {
		return []error{fmt.Errorf("--dataset %q: must be one of %s", s.Dataset, strings.Join(runDatasets, ", "))}
	}
	for _, n := range s.InputShape {
		if n < 1 {
			errs = append(errs, fmt.Errorf("--input-shape %v: every size must be ≥ 1", s.InputShape))
			break
		}
	}
	if s.Classes < 0 || (s.Labels != nil && s.Classes != 0 && s.Classes != len(s.Labels)) {
		errs = append(errs, fmt.Errorf("--classes %d with %d --labels: give the class names, or their number, or both agreeing", s.Classes, len(s.Labels)))
	}
	switch s.Dataset {
	case dataset.NameFile, dataset.NameCSV:
		if s.DataPath == "" {
			errs = append(errs, fmt.Errorf("--dataset %s needs --data-path FILE (a .csv, .npy, .npz or .parquet file, or a folder of images or .txt documents per class)", s.Dataset))
		} else if err := checkDataFile("--data-path", s.DataPath); err != nil {
			errs = append(errs, err)
		} else if f, _ := dataset.FormatOf(s.DataPath); f == dataset.FormatImageFolder && len(s.InputShape) == 0 {
			// Every process of the run derives the same default from
			// the same folder.
			shape, err := dataset.ImageFolderShape(s.DataPath)
			if err != nil {
				errs = append(errs, fmt.Errorf("--data-path: %w", err))
			}
			s.InputShape = shape
		}
	case dataset.NameLocal:
		if !runNamed {
			errs = append(errs, errors.New("--dataset local: name the run (run: NAME in the run file, or --run): every replica and node must agree on it, and nothing they share names it"))
		}
		if len(s.InputShape) == 0 || (s.Classes == 0 && s.Labels == nil) {
			errs = append(errs, errors.New("--dataset local: the run file must say what every node's data looks like: input_shape (e.g. [20]) and classes (or labels: the class names)"))
		}
		if s.TotalExamples <= 0 {
			errs = append(errs, errors.New("--dataset local: give total_examples, N, the examples the nodes hold together: q = batch_size/N is fixed before any node joins"))
		}
		if s.EvalHoldout != 0 {
			errs = append(errs, errors.New("--dataset local: eval_split_from_train needs the training data on the replicas; give eval_path (public data) or neither"))
		}
		if s.DataPath != "" {
			if err := checkDataFile("--data-path", s.DataPath); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if s.EvalPath != "" {
		if err := checkDataFile("--eval-path", s.EvalPath); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// checkDataFile says, without reading it, whether path is a data file the
// loader can read: it exists and its format is known.
func checkDataFile(flag, path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, errors.Unwrap(err))
	}
	if _, err := dataset.FormatOf(path); err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return nil
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

// stderr returns the command's stderr, made safe for the writers that
// share it: the logger's handler and the progress bar each hold only their
// own lock, and write from different goroutines (Raft, NATS and nodes log;
// the server's loop draws the bar). The first call wraps it, and later
// calls return the same lockedWriter.
func stderr(cmd *cobra.Command) io.Writer {
	w := cmd.ErrOrStderr()
	if _, ok := w.(*lockedWriter); !ok {
		w = &lockedWriter{w: w}
		cmd.SetErr(w)
	}
	return w
}

// lockedWriter serializes the writes to w. While a progress bar is on
// screen (setBar), every other write goes above it: the bar's line is
// cleared, the write made, and the bar drawn again below it, so log lines
// never land inside the bar.
type lockedWriter struct {
	mu  sync.Mutex
	w   io.Writer
	bar string // the bar's line on screen; "" when there is none
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bar == "" {
		return l.w.Write(p)
	}
	if _, err := io.WriteString(l.w, clearLine); err != nil {
		return 0, err
	}
	n, err := l.w.Write(p)
	if err != nil {
		return n, err
	}
	if len(p) > 0 && p[len(p)-1] != '\n' {
		io.WriteString(l.w, "\n")
	}
	_, err = io.WriteString(l.w, l.bar)
	return n, err
}

// clearLine returns the cursor to the line's start and erases the line
// (a carriage return and ANSI "erase in line").
const clearLine = "\r\x1b[K"

// setBar draws line as the bar, replacing the one on screen.
func (l *lockedWriter) setBar(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	io.WriteString(l.w, clearLine+line)
	l.bar = line
}

// endBar ends the bar's line: later writes go below it.
func (l *lockedWriter) endBar() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bar != "" {
		io.WriteString(l.w, "\n")
	}
	l.bar = ""
}

// newLogger returns the command's slog logger on stderr.
func newLogger(cmd *cobra.Command, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(stderr(cmd), opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr(cmd), opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}

// checkOwnDataMinNodes refuses a run whose nodes bring their own data
// (dataset local) and that says neither which nodes it has (node_ids) nor
// how many a round needs (min_nodes): the leader would open rounds with
// the first node to join, spending the budget on that site's data alone.
// serve checks it; a node's run file needs neither.
func (s *runSpec) checkOwnDataMinNodes() error {
	if s.Dataset == dataset.NameLocal && len(s.Nodes) == 0 && !s.minNodesGiven {
		return errors.New("--dataset local: say how many nodes a round needs (min_nodes: N in the run file, or --min-nodes N), " +
			"or name the nodes (node_ids: [a, b, ...], whose number is then the default): otherwise the first node to join trains alone")
	}
	return nil
}

// loraSpec is the run file's lora: the adapters' rank (0: none), alpha
// and target layers.
type loraSpec struct {
	Rank    int      `yaml:"rank"`
	Alpha   float64  `yaml:"alpha"`
	Targets []string `yaml:"targets"`
}

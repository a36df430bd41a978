package coordinator

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// ErrInvalidRunConfig is returned (wrapped, naming the field) for a run
// configuration that is out of range or inconsistent.
var ErrInvalidRunConfig = errors.New("coordinator: invalid run configuration")

// RunConfig is everything that defines a training run. It is the first
// entry of the Raft log, so every replica trains the same run, and it holds
// only public constants.
type RunConfig struct {
	// Run names the run; NATS subjects and the ledger are scoped by it.
	Run string `json:"run" msgpack:"run"`
	// ModelSpec is the model's JSON spec and ModelHash its hash; nodes
	// refuse to join a run whose hash differs from theirs.
	ModelSpec []byte `json:"model_spec" msgpack:"model_spec"`
	ModelHash string `json:"model_hash" msgpack:"model_hash"`
	// Dim is the number of model parameters.
	Dim int `json:"dim" msgpack:"dim"`
	// InitSeed seeds the deterministic initialization of θ₀ (θ₀ is public).
	InitSeed uint64 `json:"init_seed" msgpack:"init_seed"`
	// TotalExamples is N, the number of training examples across nodes.
	TotalExamples int64 `json:"total_examples" msgpack:"total_examples"`
	// SampleRate is q, the Poisson inclusion probability on every node.
	SampleRate float64 `json:"sample_rate" msgpack:"sample_rate"`
	// Optimizer holds the update rule and its hyperparameters, and the
	// mechanism's σ (NoiseMultiplier), C (ClipNorm) and B
	// (ExpectedBatchSize = q·N).
	Optimizer dpadam.Config `json:"optimizer" msgpack:"optimizer"`
	// TargetEpsilon and Delta are the privacy budget, enforced by the state
	// machine when it charges the ledger.
	TargetEpsilon float64 `json:"target_epsilon" msgpack:"target_epsilon"`
	Delta         float64 `json:"delta" msgpack:"delta"`
	// MaxSteps ends the run after this many applied steps (0: until the
	// budget is spent).
	MaxSteps int64 `json:"max_steps" msgpack:"max_steps"`
	// SeedPolicy says where the leader's noise comes from: seed.Crypto (the
	// default, a CSPRNG seeded from the OS) or seed.Seeded for reproducible
	// tests only; a seeded run is labelled as such everywhere.
	SeedPolicy seed.Policy `json:"seed_policy" msgpack:"seed_policy"`
	// NoiseMode says how the leader draws the noise: NoiseDiscrete (the
	// secure mechanism: the sum snapped to a grid plus exact discrete
	// Gaussian noise, package mechanism; what new runs use) or NoiseFloat
	// (the legacy floating-point sampler, not protected against
	// floating-point attacks, only by explicit choice). NoiseLegacy, the
	// empty string, is what configurations written before the field existed
	// decode to; it means what they meant then: the floating-point sampler.
	// The field is omitted when empty, so such a configuration re-encodes
	// to the same bytes.
	NoiseMode string `json:"noise_mode,omitempty" msgpack:"noise_mode,omitempty"`
	// Accountant names the accountant the state machine enforces the budget
	// with and σ is calibrated with: AccountantPLD (what new runs with a
	// noise mode it supports get, ledger.AccountantSupports) or
	// AccountantRDP. AccountantLegacy, the empty string, is what
	// configurations written before the field existed decode to; it means
	// what they meant then: RDP. Omitted when empty, so such a
	// configuration re-encodes to the same bytes.
	Accountant string `json:"accountant,omitempty" msgpack:"accountant,omitempty"`
	// DataSchema, if not empty, says the run's nodes bring their own data
	// (node-local data) and what it must look like: dataset.Schema's
	// String (input shape, classes, a hash of the label names). A node
	// then claims no shard of a shared training set; it reports its
	// schema and its example count, and admitNode refuses it unless the
	// schema is this one. TotalExamples is then the N the run file
	// declares, which the live nodes' counts may not exceed
	// (checkShards). Empty for a run whose nodes cut one training set into
	// IID shards, and for configurations written before the field existed
	// (omitted when empty: they re-encode to the same bytes).
	DataSchema string `json:"data_schema,omitempty" msgpack:"data_schema,omitempty"`
	// Nodes, if not empty, are the only node IDs the run admits, each
	// bound to its shard: node Nodes[i] holds shard i of len(Nodes) (with
	// own data: it is simply admitted). A node's certificate names its ID,
	// so with TLS no node can claim another's shard, even before that
	// node registers (admitNode). Omitted when empty.
	Nodes []string `json:"nodes,omitempty" msgpack:"nodes,omitempty"`
	// Admission, if not nil, is the run's admission to its training set's
	// lifetime privacy budget (ledger.DatasetBudget.Admit), made before the
	// configuration is first proposed. The ledger's run record states it
	// (ledger.Ledger.StartRun), so every replica's ledger names the budget
	// that counts the run, and a resumed run must carry the same one.
	// Omitted when nil.
	Admission *ledger.Admission `json:"admission,omitempty" msgpack:"admission,omitempty"`
	// Pretrained, if not nil, says θ₀ is a pretrained checkpoint's weights
	// rather than InitSeed's draw (which then initializes only the tensors
	// the checkpoint lacks, such as a new classification head). The
	// weights are public inputs; the run names them by hash, so every
	// replica, and every tool that rebuilds θ from the log, must read the
	// same bytes. Omitted when nil.
	Pretrained *Pretrained `json:"pretrained,omitempty" msgpack:"pretrained,omitempty"`
	// Names, if not nil, names the classes and the columns the model
	// reads, so that the trained model can be used by name outside the
	// run (export writes them into the model's metadata). Nothing
	// replicated depends on it. Nil for a run that has no names (integer
	// labels, unnamed features), and for configurations written before the
	// field existed: omitted when nil, and a log whose configuration has
	// none accepts the same run given with names (sameRun).
	Names *DataNames `json:"names,omitempty" msgpack:"names,omitempty"`
}

// DataNames are the names of a run's classes and of the data columns its
// model reads (RunConfig.Names): the data's format, as the class count
// and input shape are, not its rows.
type DataNames struct {
	// Classes are the class names in class order (the model's outputs).
	Classes []string `json:"classes,omitempty" msgpack:"classes,omitempty"`
	// Features are the feature columns in the order the model reads them.
	Features []string `json:"features,omitempty" msgpack:"features,omitempty"`
	// LabelColumn, TextColumn and TextPairColumn are the columns of a
	// data file with a header that held the label and the text.
	LabelColumn    string `json:"label_column,omitempty" msgpack:"label_column,omitempty"`
	TextColumn     string `json:"text_column,omitempty" msgpack:"text_column,omitempty"`
	TextPairColumn string `json:"text_pair_column,omitempty" msgpack:"text_pair_column,omitempty"`
}

// Pretrained names the checkpoint a run starts from (RunConfig.Pretrained).
type Pretrained struct {
	// WeightsSHA256 is the hex SHA-256 of the checkpoint's
	// model.safetensors file, in lowercase (transport.ValidWeights): nodes
	// report theirs in Join and Heartbeat, and the leader refuses one
	// whose string differs.
	WeightsSHA256 string `json:"weights_sha256" msgpack:"weights_sha256"`
	// Config is the checkpoint's config.json, as read: with the model spec
	// it rebuilds the map between θ and the checkpoint's tensor names,
	// which export needs to write the model back in the checkpoint's own
	// format.
	Config []byte `json:"config" msgpack:"config"`
}

// pretrainedWeights is the weights hash a node of the run must report in
// Join and Heartbeat: Pretrained's WeightsSHA256, or "" for a run with no
// checkpoint.
func (c RunConfig) pretrainedWeights() string {
	if c.Pretrained == nil {
		return ""
	}
	return c.Pretrained.WeightsSHA256
}

// Accountants (RunConfig.Accountant). The ledger's run record names the
// run's accountant.
const (
	AccountantPLD    = ledger.AccountantPLD
	AccountantRDP    = ledger.AccountantRDP
	AccountantLegacy = ""
	// DefaultAccountant is the accountant new runs get unless told
	// otherwise, where their noise mode allows it (DefaultAccountantFor).
	DefaultAccountant = AccountantPLD
)

// AccountantName returns the accountant the run is charged with: its
// Accountant, or AccountantRDP for a run configured before accountants
// were recorded (AccountantLegacy).
func (c RunConfig) AccountantName() string {
	if c.Accountant == AccountantLegacy {
		return AccountantRDP
	}
	return c.Accountant
}

// Accounting returns the accountant the run is charged and calibrated
// with (AccountantName), or accounting.ErrInvalidParameter for a name it
// does not know.
func (c RunConfig) Accounting() (accounting.Accountant, error) {
	return accounting.New(accounting.Name(c.AccountantName()))
}

// DefaultAccountantFor returns the accountant a new run with the given
// noise mode gets when none is asked for: DefaultAccountant (PLD) if the
// ledger's PLD accountant can charge that mode's mechanism (it charges
// both, the discrete Gaussian through its lattice: docs/PRIVACY.md item
// 12), else RDP.
func DefaultAccountantFor(noiseMode string) string {
	if ledger.AccountantSupports(DefaultAccountant, noiseMode) {
		return DefaultAccountant
	}
	return AccountantRDP
}

// Noise modes (RunConfig.NoiseMode). The ledger's run record names the
// mode as its mechanism.
const (
	NoiseDiscrete = ledger.MechanismDiscrete
	NoiseFloat    = ledger.MechanismFloat
	NoiseLegacy   = ""
	// DefaultNoiseMode is the mode new runs get unless told otherwise.
	DefaultNoiseMode = NoiseDiscrete
)

// Discrete returns the run's discrete Gaussian mechanism (its grid, noise
// scale and effective noise multiplier), and false for a floating-point
// noise mode or a configuration the mechanism cannot be built for (which
// Validate rejects).
func (c RunConfig) Discrete() (mechanism.DiscreteGaussian, bool) {
	if c.NoiseMode != NoiseDiscrete {
		return mechanism.DiscreteGaussian{}, false
	}
	m, err := mechanism.NewDiscreteGaussian(c.Optimizer.NoiseMultiplier, c.Optimizer.ClipNorm, c.Dim)
	return m, err == nil
}

// Validate checks ranges and the relations between fields: the expected
// batch size B must equal q·N (to relative 1e-9), since DP-AdamBC's Φ and
// the noisy average g̃ = (S+z)/B both depend on it.
func (c RunConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidRunConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Admission != nil && c.Admission.Validate() != nil:
		return bad("dataset budget admission: %v", c.Admission.Validate())
	case c.Pretrained != nil && (c.Pretrained.WeightsSHA256 == "" || !transport.ValidWeights(c.Pretrained.WeightsSHA256) || len(c.Pretrained.Config) == 0):
		return bad("pretrained checkpoint: want a weights hash of 64 lowercase hex digits and its config.json, have %q and %d bytes", c.Pretrained.WeightsSHA256, len(c.Pretrained.Config))
	case c.Run == "":
		return bad("run name is empty")
	case c.Dim <= 0:
		return bad("dim %d must be positive", c.Dim)
	case c.TotalExamples <= 0:
		return bad("total examples %d must be positive", c.TotalExamples)
	case !(c.SampleRate > 0 && c.SampleRate <= 1):
		return bad("sample rate %v must be in (0, 1]", c.SampleRate)
	case !(c.TargetEpsilon > 0) || math.IsInf(c.TargetEpsilon, 0):
		return bad("target epsilon %v must be positive and finite", c.TargetEpsilon)
	case !(c.Delta > 0 && c.Delta < 1):
		return bad("delta %v must be in (0, 1)", c.Delta)
	case c.MaxSteps < 0:
		return bad("max steps %d must not be negative", c.MaxSteps)
	case c.NoiseMode != NoiseDiscrete && c.NoiseMode != NoiseFloat && c.NoiseMode != NoiseLegacy:
		return bad("noise mode %q must be %q or %q", c.NoiseMode, NoiseDiscrete, NoiseFloat)
	case c.Accountant != AccountantPLD && c.Accountant != AccountantRDP && c.Accountant != AccountantLegacy:
		return bad("accountant %q must be %q or %q", c.Accountant, AccountantPLD, AccountantRDP)
	case !ledger.AccountantSupports(c.Accountant, c.NoiseMode):
		return bad("accountant %q cannot charge noise mode %q; use accountant %q", c.Accountant, c.NoiseMode, AccountantRDP)
	}
	seen := make(map[string]bool, len(c.Nodes))
	for _, id := range c.Nodes {
		if !transport.ValidRunName(id) || seen[id] { // node IDs follow the same rule as run names
			return bad("nodes %q: each must be a distinct ID of 1-64 of [A-Za-z0-9_-]", c.Nodes)
		}
		seen[id] = true
	}
	if err := c.SeedPolicy.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRunConfig, err)
	}
	if err := c.Optimizer.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRunConfig, err)
	}
	if !(c.Optimizer.NoiseMultiplier > 0) {
		return bad("noise multiplier %v must be positive: a run without noise is not private", c.Optimizer.NoiseMultiplier)
	}
	if c.NoiseMode == NoiseDiscrete {
		if _, err := mechanism.NewDiscreteGaussian(c.Optimizer.NoiseMultiplier, c.Optimizer.ClipNorm, c.Dim); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRunConfig, err)
		}
	}
	b := c.SampleRate * float64(c.TotalExamples)
	if math.Abs(c.Optimizer.ExpectedBatchSize-b) > 1e-9*b {
		return bad("expected batch size %v must equal q·N = %v", c.Optimizer.ExpectedBatchSize, b)
	}
	return nil
}

// runMismatch is the error of a replica given run while its log holds the
// run configuration logged: ErrRunMismatch, naming every field that
// differs with both values (ConfigDiff) and what to do.
func runMismatch(logged, run RunConfig) error {
	diff := ConfigDiff(logged, run)
	if len(diff) == 0 {
		diff = []string{"(no field differs; the encodings do)"}
	}
	return fmt.Errorf("%w: the log holds run %q, and %s; continue the run with its settings, or start a new run (with its own budget) in a new data directory",
		ErrRunMismatch, logged.Run, strings.Join(diff, ", "))
}

// ConfigDiff lists the fields in which given differs from logged, by their
// JSON names (nested ones dotted), as "NAME is A in the log, B given";
// the model spec is compared but not printed.
func ConfigDiff(logged, given RunConfig) []string {
	var out []string
	var walk func(prefix string, a, b reflect.Value)
	walk = func(prefix string, a, b reflect.Value) {
		t := a.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			name = prefix + name
			fa, fb := a.Field(i), b.Field(i)
			switch {
			case f.Type.Kind() == reflect.Struct:
				walk(name+".", fa, fb)
			case f.Type == reflect.TypeFor[[]byte]():
				if !bytes.Equal(fa.Bytes(), fb.Bytes()) {
					out = append(out, name+" differs")
				}
			case !reflect.DeepEqual(fa.Interface(), fb.Interface()):
				out = append(out, fmt.Sprintf("%s is %v in the log, %v given", name, fa.Interface(), fb.Interface()))
			}
		}
	}
	walk("", reflect.ValueOf(logged), reflect.ValueOf(given))
	return out
}

// sameRun reports whether given is the run the log holds as logged:
// sameConfig, except that a logged configuration without Names (written
// before the field existed) matches given whatever names it carries, so
// such a run resumes with a newer binary.
func sameRun(logged, given RunConfig) bool {
	if logged.Names == nil {
		given.Names = nil
	}
	return sameConfig(logged, given)
}

func sameConfig(a, b RunConfig) bool {
	ab, err1 := msgpack.Marshal(a)
	bb, err2 := msgpack.Marshal(b)
	return err1 == nil && err2 == nil && string(ab) == string(bb)
}

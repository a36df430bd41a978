package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/pretrained"
)

// defaultPretrainedSeqLen is the tokens per example of a run that starts
// from a checkpoint and gives no --seq-len, unless the checkpoint's
// position embedding is shorter.
const defaultPretrainedSeqLen = 128

// checkInitFrom checks --init-from before any data loads: the checkpoint's
// config.json, the names and shapes of its tensors, and the tokenizer (by
// default the checkpoint's own) against its vocabulary, each a one-line
// error. It fills the defaults the checkpoint implies: --tokenizer is the
// checkpoint's folder and --seq-len 128 or the position embedding's
// length if shorter. The classification head is checked against the
// config's num_labels here, against the data's classes once they are
// known (modelFor).
func (s *runSpec) checkInitFrom(fs *pflag.FlagSet, fileKeys map[string]bool) error {
	if s.InitFrom == "" {
		if len(s.Trainable) > 0 || len(s.Freeze) > 0 || s.LoRA.Rank != 0 {
			return errors.New("--trainable, --freeze and --lora-rank choose what trains of a pretrained checkpoint: give its folder with --init-from")
		}
		return nil
	}
	if fs.Changed("model") || fs.Changed("model-spec") || fileKeys["model"] || fileKeys["model_spec"] {
		return fmt.Errorf("--init-from %s builds the model from the checkpoint's config.json: leave out --model and --model-spec", s.InitFrom)
	}
	if s.Tokenizer == "" {
		s.Tokenizer = s.InitFrom
	}
	cfg, err := checkpoint.ReadConfig(s.InitFrom)
	if err != nil {
		return fmt.Errorf("--init-from: %w", err)
	}
	if s.SeqLen == 0 {
		s.SeqLen = min(defaultPretrainedSeqLen, cfg.MaxSequence())
	}
	// Classes 0: the head as config.json has it, until the data says.
	ck, err := pretrained.Open(s.InitFrom, pretrained.Options{SeqLen: s.SeqLen})
	if err != nil {
		return fmt.Errorf("--init-from: %w", err)
	}
	defer ck.Close()
	tok, err := dataset.LoadPretrainedTokenizer(s.Tokenizer, s.SeqLen)
	if err != nil {
		return fmt.Errorf("--tokenizer %s: %w", s.Tokenizer, err)
	}
	if n := tok.VocabSize(); n > ck.Config.Vocab {
		return fmt.Errorf("--tokenizer %s has %d tokens, more than the %d rows of the checkpoint's word embedding (vocab_size): the tokenizer is not the checkpoint's", s.Tokenizer, n, ck.Config.Vocab)
	}
	if _, err := s.adaptedSpec(ck); err != nil {
		return err
	}
	return nil
}

// adaptedSpec is ck's model as the run trains it: with the LoRA adapters
// of --lora-rank and the --trainable and --freeze patterns.
func (s *runSpec) adaptedSpec(ck *pretrained.Checkpoint) (model.Spec, error) {
	spec := ck.Spec()
	if s.LoRA.Rank != 0 {
		var err error
		if spec, err = pretrained.WithLoRA(spec, ck.Config, s.LoRA.Rank, s.LoRA.Alpha, s.LoRA.Targets); err != nil {
			return spec, fmt.Errorf("--lora-rank/--lora-targets: %w", err)
		}
	} else if s.LoRA.Alpha != 0 || len(s.LoRA.Targets) > 0 {
		return spec, errors.New("--lora-alpha and --lora-targets need --lora-rank")
	}
	spec.Trainable, spec.Freeze = s.Trainable, s.Freeze
	if err := spec.Validate(); err != nil {
		return spec, fmt.Errorf("--trainable/--freeze/--lora-rank: %w", err)
	}
	return spec, nil
}

// freezes reports whether spec trains only part of its model (frozen
// layers, LoRA adapters).
func freezes(spec model.Spec) bool {
	m, err := model.New(spec)
	return err == nil && m.Freezes()
}

// frozenModel is spec's model, ck's with layers frozen or adapters
// added, its frozen values the checkpoint's weights (ck.InitFull, what
// the checkpoint lacks drawn from seed), held once.
func frozenModel(ck *pretrained.Checkpoint, spec model.Spec, seed uint64) (*model.Model, error) {
	m, err := model.New(spec)
	if err != nil {
		return nil, fmt.Errorf("--trainable/--freeze/--lora-rank: %w", err)
	}
	full := make([]float32, m.NumFullParams())
	if err := ck.InitFull(m, full, seed); err != nil {
		return nil, err
	}
	return m.WithFrozen(full)
}

// pretrainedModel is modelFor of a run that starts from a checkpoint: the
// checkpoint's architecture with a head of the data's classes over its
// token sequences.
func (s *runSpec) pretrainedModel(shape []int, classes, vocab int) (*model.Model, error) {
	if len(shape) != 1 || vocab < 1 {
		return nil, fmt.Errorf("--init-from %s: the data must be token sequences (text, tokenized by the checkpoint's tokenizer), not shape %v", s.InitFrom, shape)
	}
	ck, err := pretrained.Open(s.InitFrom, pretrained.Options{SeqLen: shape[0], Classes: classes})
	if err != nil {
		return nil, fmt.Errorf("--init-from: %w", err)
	}
	defer ck.Close()
	if vocab > ck.Config.Vocab {
		return nil, fmt.Errorf("--init-from %s: the data's token ids go up to %d, the checkpoint's vocabulary has %d", s.InitFrom, vocab, ck.Config.Vocab)
	}
	s.pretrained = &coordinator.Pretrained{WeightsSHA256: ck.WeightsSHA256, Config: ck.ConfigJSON}
	spec, err := s.adaptedSpec(ck)
	if err != nil {
		return nil, err
	}
	if freezes(spec) {
		return frozenModel(ck, spec, s.InitSeed)
	}
	return model.New(spec)
}

// logImport says what the import of the checkpoint found: the tensors
// read, initialized afresh and left unused.
func logImport(log *slog.Logger, ck *pretrained.Checkpoint) {
	r := ck.Report
	log.Info("pretrained checkpoint", "dir", ck.Dir, "family", ck.Config.Family, "weights_sha256", ck.WeightsSHA256,
		"tensors_read", len(r.Present), "newly_initialized", strings.Join(r.Fresh, ","))
	if len(r.Unexpected) > 0 {
		log.Info("pretrained checkpoint: tensors the model does not use", "count", len(r.Unexpected), "names", strings.Join(firstNames(r.Unexpected, 8), ","))
	}
}

func firstNames(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}

// errNeedsInitFrom says a run started from a checkpoint needs it to
// rebuild θ₀.
var errNeedsInitFrom = errors.New("the run starts from a pretrained checkpoint: give its folder with --init-from")

// initFunc is the replicas' θ₀ (coordinator.InitFunc): modelInit, the
// run's model drawn from its seed, unless the run starts from a
// checkpoint (RunConfig.Pretrained); then the checkpoint in initFrom,
// which must hold the weights the run names, with the tensors it lacks
// drawn from the seed (pretrained.Checkpoint.Init). For a run that
// freezes layers, θ₀ is the trainable part of that: taken from have,
// the process's own model, when it is the run's (its frozen values are
// the checkpoint's, already read), else read again.
func initFunc(initFrom string, log *slog.Logger, have *model.Model) coordinator.InitFunc {
	return func(c coordinator.RunConfig) ([]float32, error) {
		if c.Pretrained == nil {
			return modelInit(c)
		}
		if have != nil && have.Freezes() && have.Hash() == c.ModelHash {
			theta := make([]float32, have.NumParams())
			return theta, have.Init(theta, c.InitSeed)
		}
		if initFrom == "" {
			return nil, fmt.Errorf("%w (weights SHA-256 %s)", errNeedsInitFrom, c.Pretrained.WeightsSHA256)
		}
		spec, err := model.ParseSpec(c.ModelSpec)
		if err != nil {
			return nil, err
		}
		ck, err := openRunCheckpoint(initFrom, c, spec)
		if err != nil {
			return nil, err
		}
		defer ck.Close()
		if log != nil {
			logImport(log, ck)
		}
		m := ck.Model()
		if freezes(spec) {
			if m, err = frozenModel(ck, spec, c.InitSeed); err != nil {
				return nil, err
			}
		}
		if m.Hash() != c.ModelHash {
			return nil, fmt.Errorf("--init-from %s builds model %s, the run's is %s", initFrom, m.Hash(), c.ModelHash)
		}
		theta := make([]float32, m.NumParams())
		if m.Freezes() {
			return theta, m.Init(theta, c.InitSeed)
		}
		return theta, ck.Init(theta, c.InitSeed)
	}
}

// openRunCheckpoint opens the checkpoint folder dir for the run c, whose
// model spec is spec, and checks that its weights are the run's.
func openRunCheckpoint(dir string, c coordinator.RunConfig, spec model.Spec) (*pretrained.Checkpoint, error) {
	ck, err := pretrained.Open(dir, pretrained.Options{SeqLen: spec.Input[0], Classes: spec.Classes})
	if err != nil {
		return nil, fmt.Errorf("--init-from: %w", err)
	}
	if ck.WeightsSHA256 != c.Pretrained.WeightsSHA256 {
		ck.Close()
		return nil, fmt.Errorf("--init-from %s: its weights have SHA-256 %s, the run started from %s: not the same checkpoint",
			dir, ck.WeightsSHA256, c.Pretrained.WeightsSHA256)
	}
	return ck, nil
}

// checkWeights checks that the checkpoint folder dir holds the weights
// the run c started from.
func checkWeights(dir string, c coordinator.RunConfig) error {
	spec, err := model.ParseSpec(c.ModelSpec)
	if err != nil {
		return err
	}
	ck, err := openRunCheckpoint(dir, c, spec)
	if err != nil {
		return err
	}
	return ck.Close()
}

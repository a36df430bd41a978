package pretrained

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/model"
)

// ErrUnsupported is returned, wrapped with the reason, for a checkpoint
// whose configuration package checkpoint reads but which this package
// cannot yet build a model of (RoBERTa, an activation the engine lacks, a
// head other than sequence classification).
var ErrUnsupported = errors.New("pretrained: not supported")

// Options are what a run adds to a checkpoint's configuration: how long
// its examples are and what its head predicts.
type Options struct {
	// SeqLen is the number of tokens per example; at most the position
	// embedding's length (Config.MaxSequence).
	SeqLen int
	// Classes is the number of outputs of the classification head (at
	// least 2); 0 takes the configuration's num_labels, to check a
	// checkpoint before the data says how many classes it has.
	Classes int
	// SepID is BERT's [SEP] id, which ends the first segment of a pair
	// (the token types are read from its positions:
	// model.LayerSpec.TypeSep). Load reads it from the checkpoint's
	// vocab.txt; SpecFor needs it for BERT unless type_vocab_size is 1.
	SepID int
}

// binding says where one parameter of the engine's model comes from in
// the checkpoint: the parts, whole tensors named as checkpoint.Expected
// names them, concatenated along the first axis (BERT's query, key and
// value weights are one engine tensor [3H, H]). Transposed parts are
// stored [in, out] (GPT-2's Conv1D) and read into the engine's [out, in].
type binding struct {
	param      string
	parts      []string
	transposed bool
}

// plan is a model's spec and the bindings of its parameters, built
// together so that they cannot disagree.
type plan struct {
	spec     model.Spec
	bindings []binding
	// opt are the options the plan was built with, Classes resolved.
	opt Options
}

// SpecFor returns the engine spec of cfg's model with a sequence
// classification head of opt.Classes outputs over opt.SeqLen tokens (-1 is
// padding), the architecture of BertForSequenceClassification or
// GPT2ForSequenceClassification without dropout (the engine has none; a
// fine-tuned model is used the way it is trained, in eval mode).
func SpecFor(cfg checkpoint.Config, opt Options) (model.Spec, error) {
	p, err := planFor(cfg, opt)
	return p.spec, err
}

// planFor builds the spec and the bindings (SpecFor).
func planFor(cfg checkpoint.Config, opt Options) (plan, error) {
	if err := cfg.Validate(); err != nil {
		return plan{}, err
	}
	if opt.SeqLen < 1 || opt.SeqLen > cfg.MaxSequence() {
		return plan{}, fmt.Errorf("pretrained: %d tokens per example: the checkpoint's position embedding covers 1 to %d", opt.SeqLen, cfg.MaxSequence())
	}
	if opt.Classes == 0 {
		opt.Classes = cfg.NumLabels
	}
	if opt.Classes < 2 {
		return plan{}, fmt.Errorf("pretrained: %d classes: a classification head needs at least 2", opt.Classes)
	}
	act, err := activation(cfg)
	if err != nil {
		return plan{}, err
	}
	var p plan
	switch cfg.Family {
	case checkpoint.BERT:
		p, err = bertPlan(cfg, opt, act)
	case checkpoint.GPT2:
		p = gpt2Plan(cfg, opt, act)
	default:
		err = fmt.Errorf("%w: %s checkpoints (BERT and GPT-2 are)", ErrUnsupported, cfg.Family)
	}
	p.opt = opt
	return p, err
}

// activation maps hidden_act / activation_function to the engine's
// layer: "gelu" is the erf form (transformers' GELUActivation), "gelu_new"
// the tanh approximation (NewGELUActivation), as activations.py defines
// them.
func activation(cfg checkpoint.Config) (string, error) {
	switch cfg.Activation {
	case "gelu":
		return model.GELU, nil
	case "gelu_new":
		return model.GELUTanh, nil
	case "relu":
		return model.ReLU, nil
	case "tanh":
		return model.Tanh, nil
	}
	return "", fmt.Errorf("%w: activation %q (gelu, gelu_new, relu and tanh are)", ErrUnsupported, cfg.Activation)
}

// builder appends layers and their bindings.
type builder struct {
	p plan
}

// layer appends a top-level layer.
func (b *builder) layer(ls model.LayerSpec, binds ...binding) {
	b.p.spec.Layers = append(b.p.spec.Layers, ls)
	b.p.bindings = append(b.p.bindings, binds...)
}

// bind returns the binding of engine parameter param to the checkpoint's
// tensors parts.
func bind(param string, parts ...string) binding { return binding{param: param, parts: parts} }

// linearBinds binds a linear layer's weight and bias, engine name prefix
// eng, to the checkpoint's nn.Linear (or Conv1D, transposed) hf.
func linearBinds(eng, hf string, transposed bool) []binding {
	return []binding{
		{param: eng + ".weight", parts: []string{hf + ".weight"}, transposed: transposed},
		{param: eng + ".bias", parts: []string{hf + ".bias"}},
	}
}

// normBinds binds a layer norm's weight and bias.
func normBinds(eng, hf string) []binding {
	return []binding{bind(eng+".weight", hf+".weight"), bind(eng+".bias", hf+".bias")}
}

// bertPlan is BertForSequenceClassification (modeling_bert.py): embeddings
// (word + position + token type, LayerNorm), post-layer-norm blocks
// (x = LN(x + attention(x)), x = LN(x + FFN(x))) with bidirectional
// attention over the non-padding tokens, the pooler (tanh of a linear
// map of the first token) and the classifier. The engine fuses each
// block's query, key and value into one linear map of 3H outputs (the
// three weights stacked, in that order), which computes the same.
func bertPlan(cfg checkpoint.Config, opt Options, act string) (plan, error) {
	h := cfg.Hidden
	emb := model.LayerSpec{Type: model.Embedding, Name: "embeddings", Vocab: cfg.Vocab, Dim: h,
		Positions: cfg.MaxPositions, Types: cfg.TypeVocab}
	if cfg.TypeVocab >= 2 {
		if opt.SepID < 0 || opt.SepID >= cfg.Vocab {
			return plan{}, fmt.Errorf("pretrained: BERT with %d token types needs the id of [SEP] in the vocabulary of %d (vocab.txt), have %d", cfg.TypeVocab, cfg.Vocab, opt.SepID)
		}
		sep := opt.SepID
		emb.TypeSep = &sep
	}
	b := &builder{p: plan{spec: model.Spec{Name: "bert-classifier", Input: []int{opt.SeqLen}, Classes: opt.Classes}}}
	const base = "bert."
	b.layer(emb,
		bind("embeddings.weight", base+"embeddings.word_embeddings.weight"),
		bind("embeddings.pos", base+"embeddings.position_embeddings.weight"),
		bind("embeddings.types", base+"embeddings.token_type_embeddings.weight"))
	norm := func(eng, hf string) {
		b.layer(model.LayerSpec{Type: model.LayerNorm, Name: eng, Eps: cfg.LayerNormEps}, normBinds(eng, hf)...)
	}
	norm("embeddings.LayerNorm", base+"embeddings.LayerNorm")
	for i := range cfg.Layers {
		eng, hf := fmt.Sprintf("layer.%d.", i), fmt.Sprintf("%sencoder.layer.%d.", base, i)
		self := hf + "attention.self."
		b.layer(model.LayerSpec{Type: model.Residual, Name: eng + "attention", Layers: []model.LayerSpec{
			{Type: model.Linear, Name: "qkv", Out: 3 * h},
			{Type: model.Attention, Heads: cfg.Heads, Mask: model.MaskPadding},
			{Type: model.Linear, Name: "output", Out: h},
		}},
			bind(eng+"attention.qkv.weight", self+"query.weight", self+"key.weight", self+"value.weight"),
			bind(eng+"attention.qkv.bias", self+"query.bias", self+"key.bias", self+"value.bias"),
			bind(eng+"attention.output.weight", hf+"attention.output.dense.weight"),
			bind(eng+"attention.output.bias", hf+"attention.output.dense.bias"))
		norm(eng+"attention.LayerNorm", hf+"attention.output.LayerNorm")
		b.layer(model.LayerSpec{Type: model.Residual, Name: eng + "ffn", Layers: []model.LayerSpec{
			{Type: model.Linear, Name: "intermediate", Out: cfg.Intermediate},
			{Type: act},
			{Type: model.Linear, Name: "output", Out: h},
		}},
			append(linearBinds(eng+"ffn.intermediate", hf+"intermediate.dense", false),
				linearBinds(eng+"ffn.output", hf+"output.dense", false)...)...)
		norm(eng+"output.LayerNorm", hf+"output.LayerNorm")
	}
	b.layer(model.LayerSpec{Type: model.FirstToken})
	b.layer(model.LayerSpec{Type: model.Linear, Name: "pooler", Out: h}, linearBinds("pooler", base+"pooler.dense", false)...)
	b.layer(model.LayerSpec{Type: model.Tanh})
	b.layer(model.LayerSpec{Type: model.Linear, Name: "classifier", Out: opt.Classes}, linearBinds("classifier", "classifier", false)...)
	return b.p, nil
}

// gpt2Plan is GPT2ForSequenceClassification (modeling_gpt2.py): token and
// position embeddings, pre-layer-norm blocks (x = x + attention(LN(x)),
// x = x + MLP(LN(x))) with causal attention, the final layer norm, and
// score, a linear map without bias, on the last token that is not
// padding. Its Conv1D weights are stored [in, out].
func gpt2Plan(cfg checkpoint.Config, opt Options, act string) plan {
	e := cfg.Hidden
	const base = "transformer."
	b := &builder{p: plan{spec: model.Spec{Name: "gpt2-classifier", Input: []int{opt.SeqLen}, Classes: opt.Classes}}}
	b.layer(model.LayerSpec{Type: model.Embedding, Name: "wte", Vocab: cfg.Vocab, Dim: e, Positions: cfg.MaxPositions},
		bind("wte.weight", base+"wte.weight"), bind("wte.pos", base+"wpe.weight"))
	for i := range cfg.Layers {
		eng, hf := fmt.Sprintf("h.%d.", i), fmt.Sprintf("%sh.%d.", base, i)
		b.layer(model.LayerSpec{Type: model.Residual, Name: eng + "attn", Layers: []model.LayerSpec{
			{Type: model.LayerNorm, Name: "ln_1", Eps: cfg.LayerNormEps},
			{Type: model.Linear, Name: "c_attn", Out: 3 * e},
			{Type: model.Attention, Heads: cfg.Heads, Mask: model.MaskCausal},
			{Type: model.Linear, Name: "c_proj", Out: e},
		}},
			slices.Concat(normBinds(eng+"attn.ln_1", hf+"ln_1"),
				linearBinds(eng+"attn.c_attn", hf+"attn.c_attn", true),
				linearBinds(eng+"attn.c_proj", hf+"attn.c_proj", true))...)
		b.layer(model.LayerSpec{Type: model.Residual, Name: eng + "mlp", Layers: []model.LayerSpec{
			{Type: model.LayerNorm, Name: "ln_2", Eps: cfg.LayerNormEps},
			{Type: model.Linear, Name: "c_fc", Out: cfg.Intermediate},
			{Type: act},
			{Type: model.Linear, Name: "c_proj", Out: e},
		}},
			slices.Concat(normBinds(eng+"mlp.ln_2", hf+"ln_2"),
				linearBinds(eng+"mlp.c_fc", hf+"mlp.c_fc", true),
				linearBinds(eng+"mlp.c_proj", hf+"mlp.c_proj", true))...)
	}
	b.layer(model.LayerSpec{Type: model.LayerNorm, Name: "ln_f", Eps: cfg.LayerNormEps}, normBinds("ln_f", base+"ln_f")...)
	b.layer(model.LayerSpec{Type: model.LastToken})
	b.layer(model.LayerSpec{Type: model.Linear, Name: "score", Out: opt.Classes, NoBias: true},
		binding{param: "score.weight", parts: []string{"score.weight"}})
	return b.p
}

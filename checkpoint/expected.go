package checkpoint

import "fmt"

// HeadKind is the output head a model puts on its family's base model.
type HeadKind int

const (
	// HeadNone is the base model alone: BertModel, RobertaModel (both with
	// their pooler) and GPT2Model.
	HeadNone HeadKind = iota
	// HeadClassifier is sequence classification with Config.NumLabels
	// outputs: BertForSequenceClassification (a linear layer on the
	// pooler's output), RobertaForSequenceClassification (a two-layer head
	// on the first token, no pooler) and GPT2ForSequenceClassification (a
	// linear layer without bias on the last token).
	HeadClassifier
	// HeadLM is the family's language-model head: BertForMaskedLM,
	// RobertaForMaskedLM and GPT2LMHeadModel, each without a pooler, their
	// output weight tied to the word embedding unless
	// Config.TieWordEmbeddings is false.
	HeadLM
)

// String returns the head's name: none, classifier, lm.
func (h HeadKind) String() string {
	switch h {
	case HeadNone:
		return "none"
	case HeadClassifier:
		return "classifier"
	case HeadLM:
		return "lm"
	}
	return fmt.Sprintf("HeadKind(%d)", int(h))
}

// Expected is a tensor a model expects in its checkpoint.
type Expected struct {
	// Name is the tensor's name as save_pretrained writes it for the
	// model with its head (bert.encoder.layer.0.attention.self.query.weight,
	// transformer.h.0.attn.c_attn.weight, classifier.weight).
	Name string
	// Shape is the tensor's shape as the file stores it: [out, in] for a
	// torch.nn.Linear weight, [in, out] for GPT-2's Conv1D (Transposed).
	// Nil for a Buffer, whose shape Check does not check.
	Shape []int
	// Transposed marks a weight stored [in, out], the transpose of a
	// Linear weight: GPT-2's Conv1D (pytorch_utils.py at transformers commit
	// 3009a8a4b92d0d63b18d11575a413a4b78a55776: weight is
	// torch.empty(nx, nf), y = x·W + b).
	Transposed bool
	// Optional marks a tensor the checkpoint may lack: a head or a pooler
	// the model initializes afresh when absent, or a tensor tied to
	// another (TiedTo).
	Optional bool
	// TiedTo names the tensor whose values this one shares (GPT-2's
	// lm_head.weight is transformer.wte.weight). A tied tensor has no
	// place of its own in θ; a checkpoint may hold it under either name.
	TiedTo string
	// Buffer marks a registered buffer that is not a parameter but that
	// checkpoints saved by some versions of transformers hold (BERT's
	// embeddings.position_ids, GPT-2's attn.bias): Check accepts it,
	// whatever its type and shape, and never reads it.
	Buffer bool
	// Prefix is the base model's attribute name (base_model_prefix: "bert.",
	// "roberta.", "transformer."), which a checkpoint saved from the bare
	// base model (BertModel, GPT2Model: openai-community/gpt2 is one)
	// leaves out of its names. Empty for the head's tensors.
	Prefix string
}

// Len returns the number of elements of the tensor: the product of its
// shape (1 for a buffer, whose shape is not given).
func (e Expected) Len() int { return TensorInfo{Shape: e.Shape}.Len() }

// Expected returns the tensors a model of cfg's family with the given head
// expects (a method, as the name Expected is the type's), as Hugging Face transformers names and shapes them: the
// parameters in the order of the model's state_dict, then the known
// buffers. The names and shapes are taken from modeling_bert.py (commit
// 8ec58104181bfb34d824d89bccc009b4f6be6e0e), modeling_roberta.py (commit
// 87b236ba2be8b3e48a7d0c8ca6513302736d2886) and modeling_gpt2.py (commit
// c44b2d9976e8eafbdcb89cb2710141b2bc9b138f). cfg must be valid (Validate);
// Expected panics for an unknown family or head, a programmer's error.
func (cfg Config) Expected(head HeadKind) []Expected {
	if head < HeadNone || head > HeadLM {
		panic(fmt.Sprintf("checkpoint: Expected with %v", head))
	}
	switch cfg.Family {
	case BERT:
		return bertExpected(cfg, head, "bert.")
	case RoBERTa:
		return bertExpected(cfg, head, "roberta.")
	case GPT2:
		return gpt2Expected(cfg, head)
	}
	panic(fmt.Sprintf("checkpoint: Expected for family %q", cfg.Family))
}

// builder appends Expected entries.
type builder struct {
	out    []Expected
	prefix string // set on each entry added
}

func (b *builder) add(e Expected) {
	e.Prefix = b.prefix
	b.out = append(b.out, e)
}

// param adds a required parameter.
func (b *builder) param(name string, shape ...int) { b.add(Expected{Name: name, Shape: shape}) }

// linear adds a torch.nn.Linear(in, out): weight [out, in], bias [out].
func (b *builder) linear(name string, in, out int, optional bool) {
	b.add(Expected{Name: name + ".weight", Shape: []int{out, in}, Optional: optional})
	b.add(Expected{Name: name + ".bias", Shape: []int{out}, Optional: optional})
}

// norm adds a torch.nn.LayerNorm(n): weight and bias [n].
func (b *builder) norm(name string, n int, optional bool) {
	b.add(Expected{Name: name + ".weight", Shape: []int{n}, Optional: optional})
	b.add(Expected{Name: name + ".bias", Shape: []int{n}, Optional: optional})
}

// conv1d adds GPT-2's Conv1D(nf=out, nx=in): weight [in, out], bias [out].
func (b *builder) conv1d(name string, in, out int) {
	b.add(Expected{Name: name + ".weight", Shape: []int{in, out}, Transposed: true})
	b.add(Expected{Name: name + ".bias", Shape: []int{out}})
}

// bertExpected lists BERT's tensors, or RoBERTa's (base "roberta."), which
// has the same embeddings (RobertaEmbeddings differs from BertEmbeddings
// only in numbering positions from padding_idx+1) and encoder, and its own
// heads: RobertaClassificationHead (dense, out_proj) and RobertaLMHead
// (dense, layer_norm, decoder, bias).
func bertExpected(cfg Config, head HeadKind, base string) []Expected {
	h, roberta := cfg.Hidden, base == "roberta."
	b := &builder{prefix: base}
	b.param(base+"embeddings.word_embeddings.weight", cfg.Vocab, h)
	b.param(base+"embeddings.position_embeddings.weight", cfg.MaxPositions, h)
	b.param(base+"embeddings.token_type_embeddings.weight", cfg.TypeVocab, h)
	b.norm(base+"embeddings.LayerNorm", h, false)
	for i := range cfg.Layers {
		l := fmt.Sprintf("%sencoder.layer.%d.", base, i)
		b.linear(l+"attention.self.query", h, h, false)
		b.linear(l+"attention.self.key", h, h, false)
		b.linear(l+"attention.self.value", h, h, false)
		b.linear(l+"attention.output.dense", h, h, false)
		b.norm(l+"attention.output.LayerNorm", h, false)
		b.linear(l+"intermediate.dense", h, cfg.Intermediate, false)
		b.linear(l+"output.dense", cfg.Intermediate, h, false)
		b.norm(l+"output.LayerNorm", h, false)
	}
	// BertModel and RobertaModel have a pooler unless built with
	// add_pooling_layer=False, as the masked-LM models and
	// RobertaForSequenceClassification are.
	if head == HeadNone || (head == HeadClassifier && !roberta) {
		b.linear(base+"pooler.dense", h, h, true)
	}
	words := base + "embeddings.word_embeddings.weight"
	b.prefix = ""
	switch {
	case head == HeadClassifier && roberta:
		b.linear("classifier.dense", h, h, true)
		b.linear("classifier.out_proj", h, cfg.NumLabels, true)
	case head == HeadClassifier:
		b.linear("classifier", h, cfg.NumLabels, true)
	case head == HeadLM && roberta:
		b.linear("lm_head.dense", h, h, true)
		b.norm("lm_head.layer_norm", h, true)
		b.add(Expected{Name: "lm_head.bias", Shape: []int{cfg.Vocab}, Optional: true})
		b.add(lmWeight("lm_head.decoder.weight", cfg, words))
		b.add(Expected{Name: "lm_head.decoder.bias", Shape: []int{cfg.Vocab}, Optional: true, TiedTo: "lm_head.bias"})
	case head == HeadLM:
		b.linear("cls.predictions.transform.dense", h, h, true)
		b.norm("cls.predictions.transform.LayerNorm", h, true)
		b.add(Expected{Name: "cls.predictions.bias", Shape: []int{cfg.Vocab}, Optional: true})
		b.add(lmWeight("cls.predictions.decoder.weight", cfg, words))
		b.add(Expected{Name: "cls.predictions.decoder.bias", Shape: []int{cfg.Vocab}, Optional: true, TiedTo: "cls.predictions.bias"})
	}
	// position_ids and token_type_ids are buffers, registered with
	// persistent=False by current versions and saved by older ones.
	b.prefix = base
	b.add(Expected{Name: base + "embeddings.position_ids", Buffer: true, Optional: true})
	b.add(Expected{Name: base + "embeddings.token_type_ids", Buffer: true, Optional: true})
	return b.out
}

// lmWeight is a language-model head's output weight [vocab, hidden]: tied
// to the word embedding words unless cfg unties it, then a parameter of
// its own, initialized afresh when absent.
func lmWeight(name string, cfg Config, words string) Expected {
	e := Expected{Name: name, Shape: []int{cfg.Vocab, cfg.Hidden}, Optional: true}
	if cfg.TieWordEmbeddings {
		e.TiedTo = words
	}
	return e
}

// gpt2Expected lists GPT-2's tensors: GPT2Model's wte, wpe, blocks h.N
// (ln_1, attn.c_attn [n_embd, 3·n_embd], attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj, the four projections Conv1D) and ln_f, under "transformer.",
// then the head: GPT2LMHeadModel's lm_head (Linear without bias) or
// GPT2ForSequenceClassification's score (Linear without bias).
func gpt2Expected(cfg Config, head HeadKind) []Expected {
	const base = "transformer."
	e := cfg.Hidden
	b := &builder{prefix: base}
	b.param(base+"wte.weight", cfg.Vocab, e)
	b.param(base+"wpe.weight", cfg.MaxPositions, e)
	for i := range cfg.Layers {
		l := fmt.Sprintf("%sh.%d.", base, i)
		b.norm(l+"ln_1", e, false)
		b.conv1d(l+"attn.c_attn", e, 3*e)
		b.conv1d(l+"attn.c_proj", e, e)
		b.norm(l+"ln_2", e, false)
		b.conv1d(l+"mlp.c_fc", e, cfg.Intermediate)
		b.conv1d(l+"mlp.c_proj", cfg.Intermediate, e)
	}
	b.norm(base+"ln_f", e, false)
	b.prefix = ""
	switch head {
	case HeadClassifier:
		b.add(Expected{Name: "score.weight", Shape: []int{cfg.NumLabels, e}, Optional: true})
	case HeadLM:
		b.add(lmWeight("lm_head.weight", cfg, base+"wte.weight"))
	}
	// GPT2Attention's causal mask and masked_bias are buffers,
	// persistent=False in current versions; older checkpoints
	// (openai-community/gpt2's among them) hold them.
	b.prefix = base
	for i := range cfg.Layers {
		b.add(Expected{Name: fmt.Sprintf("%sh.%d.attn.bias", base, i), Buffer: true, Optional: true})
		b.add(Expected{Name: fmt.Sprintf("%sh.%d.attn.masked_bias", base, i), Buffer: true, Optional: true})
	}
	return b.out
}

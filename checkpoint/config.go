package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

var (
	// ErrNoConfig is returned, wrapped, by ReadConfig for a folder without
	// a config.json.
	ErrNoConfig = errors.New("checkpoint: no config.json")
	// ErrConfig is returned, wrapped with the reason, by ReadConfig and
	// Validate for a config.json that does not decode or does not
	// describe a model this package knows.
	ErrConfig = errors.New("checkpoint: bad config.json")
)

// Family is a model architecture, named by Hugging Face's model_type.
type Family string

// The families ReadConfig knows.
const (
	BERT    Family = "bert"
	RoBERTa Family = "roberta"
	GPT2    Family = "gpt2"
)

// families lists, per family, the model classes of Hugging Face
// transformers whose names config.json's "architectures" may hold (the
// classes of modeling_bert.py, modeling_roberta.py and modeling_gpt2.py).
var families = map[Family][]string{
	BERT: {"BertModel", "BertForPreTraining", "BertLMHeadModel", "BertForMaskedLM", "BertForNextSentencePrediction",
		"BertForSequenceClassification", "BertForMultipleChoice", "BertForTokenClassification", "BertForQuestionAnswering"},
	RoBERTa: {"RobertaModel", "RobertaForCausalLM", "RobertaForMaskedLM", "RobertaForSequenceClassification",
		"RobertaForMultipleChoice", "RobertaForTokenClassification", "RobertaForQuestionAnswering"},
	GPT2: {"GPT2Model", "GPT2LMHeadModel", "GPT2DoubleHeadsModel", "GPT2ForSequenceClassification",
		"GPT2ForTokenClassification", "GPT2ForQuestionAnswering"},
}

// activations lists the hidden_act (BERT, RoBERTa) or activation_function
// (GPT-2) values each family's configuration documents: "gelu", "relu",
// "silu" and "gelu_new" in configuration_bert.py (RobertaConfig inherits
// BertConfig); "relu", "silu", "gelu", "tanh" and "gelu_new" in
// configuration_gpt2.py.
var activations = map[Family][]string{
	BERT:    {"gelu", "relu", "silu", "gelu_new"},
	RoBERTa: {"gelu", "relu", "silu", "gelu_new"},
	GPT2:    {"relu", "silu", "gelu", "tanh", "gelu_new"},
}

// Config is a model's config.json, normalized across the families: GPT-2's
// n_embd, n_head, n_layer, n_inner, n_positions, layer_norm_epsilon and
// activation_function fill the fields BERT and RoBERTa name hidden_size,
// num_attention_heads, num_hidden_layers, intermediate_size,
// max_position_embeddings, layer_norm_eps and hidden_act.
type Config struct {
	Family        Family
	ModelType     string   // model_type as written ("" when config.json has none)
	Architectures []string // the model classes config.json names

	Hidden       int // hidden_size, n_embd
	Heads        int // num_attention_heads, n_head
	Layers       int // num_hidden_layers, n_layer
	Intermediate int // intermediate_size; GPT-2's n_inner, 4·n_embd when null
	Vocab        int // vocab_size
	MaxPositions int // max_position_embeddings, n_positions: rows of the position embedding
	TypeVocab    int // type_vocab_size (BERT, RoBERTa); 0 for GPT-2

	// PositionOffset is the first row of the position embedding a token
	// uses: RoBERTa numbers positions from padding_idx+1 (fairseq's
	// make_positions, create_position_ids_from_input_ids in
	// modeling_roberta.py), so a sequence has at most MaxPositions −
	// PositionOffset tokens; 0 for BERT and GPT-2.
	PositionOffset int

	LayerNormEps float64 // layer_norm_eps, layer_norm_epsilon
	Activation   string  // hidden_act, activation_function
	PadTokenID   int     // pad_token_id; -1 when there is none (GPT-2's default)

	// TieWordEmbeddings says that the language-model head's weight is the
	// word embedding (PretrainedConfig's tie_word_embeddings, true unless
	// config.json says otherwise).
	TieWordEmbeddings bool

	NumLabels int      // a classification head's outputs: len(id2label), else num_labels, else 2
	Labels    []string // id2label in id order; nil when config.json has none
}

// familyDefaults returns the defaults of each family's configuration
// class for the keys config.json may omit: BertConfig.__init__ in
// configuration_bert.py (transformers commit
// 008f5c8c29be84d4721dc6d1e0fcd72300580be4), RobertaConfig's overrides in
// configuration_roberta.py (commit dc78c950801754520209ec58ec35b1d765601eda:
// pad_token_id 1, the rest BERT's) and GPT2Config.__init__ in
// configuration_gpt2.py (commit 01ae98ae2414210efd0d9ac1ffe78ff21588f1f7).
func familyDefaults(f Family) Config {
	switch f {
	case GPT2:
		return Config{Family: f, Hidden: 768, Heads: 12, Layers: 12, Vocab: 50257, MaxPositions: 1024,
			LayerNormEps: 1e-5, Activation: "gelu_new", PadTokenID: -1, TieWordEmbeddings: true, NumLabels: 2}
	case RoBERTa:
		c := familyDefaults(BERT)
		c.Family, c.PadTokenID = f, 1
		return c
	}
	return Config{Family: BERT, Hidden: 768, Heads: 12, Layers: 12, Intermediate: 3072, Vocab: 30522, MaxPositions: 512,
		TypeVocab: 2, LayerNormEps: 1e-12, Activation: "gelu", PadTokenID: 0, TieWordEmbeddings: true, NumLabels: 2}
}

// ReadConfig reads dir/config.json, fills the keys it omits with its
// family's defaults, and validates the result (Validate). Errors are one
// line: ErrNoConfig for a folder without config.json (naming what the
// folder holds), ErrConfig for JSON that does not decode, an unknown
// model_type or architecture, a key of the wrong type, or a failed check.
func ReadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		if st, serr := os.Stat(dir); errors.Is(err, fs.ErrNotExist) || serr != nil || !st.IsDir() {
			return Config{}, fmt.Errorf("%w in %s: %s", ErrNoConfig, dir, describeDir(dir))
		}
		return Config{}, err
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// describeDir says what dir holds, for an error about a missing file.
func describeDir(dir string) string {
	st, err := os.Stat(dir)
	switch {
	case err != nil:
		return err.Error()
	case !st.IsDir():
		return "it is a file, not a checkpoint folder"
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	if len(entries) == 0 {
		return "the folder is empty"
	}
	const most = 8
	var names []string
	for _, e := range entries[:min(len(entries), most)] {
		n := e.Name()
		if e.IsDir() {
			n += "/"
		}
		names = append(names, n)
	}
	if len(entries) > most {
		names = append(names, fmt.Sprintf("and %d more", len(entries)-most))
	}
	return "the folder holds " + strings.Join(names, ", ")
}

// ParseConfig decodes config.json's bytes as ReadConfig does: defaults
// filled, validated, errors one line wrapping ErrConfig.
func ParseConfig(b []byte) (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	var raw keys
	if err := json.Unmarshal(b, &raw); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line := 1 + bytes.Count(b[:se.Offset], []byte("\n"))
			return bad("line %d: %v", line, err)
		}
		return bad("%v", err)
	}
	var c Config
	var err error
	if c.ModelType, err = raw.str("", "model_type"); err != nil {
		return bad("%v", err)
	}
	if err := raw.decode("architectures", &c.Architectures); err != nil {
		return bad("%v", err)
	}
	fam, err := family(c.ModelType, c.Architectures)
	if err != nil {
		return bad("%v", err)
	}
	model, arch := c.ModelType, c.Architectures
	c = familyDefaults(fam)
	c.ModelType, c.Architectures = model, arch
	if err := raw.fill(&c); err != nil {
		return bad("%v", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// family resolves the model family from model_type and architectures:
// model_type decides when present, and every architecture must belong to
// it; without model_type (configurations older than the key) the
// architectures decide.
func family(modelType string, archs []string) (Family, error) {
	supported := "supported: model_type bert, roberta or gpt2, architectures " + strings.Join(slices.Concat(families[BERT], families[RoBERTa], families[GPT2]), ", ")
	var fam Family
	if modelType != "" {
		fam = Family(modelType)
		if _, ok := families[fam]; !ok {
			return "", fmt.Errorf("model_type %q is not a supported model (%s)", modelType, supported)
		}
	}
	for _, a := range archs {
		var of Family
		for f, classes := range families {
			if slices.Contains(classes, a) {
				of = f
			}
		}
		switch {
		case of == "":
			return "", fmt.Errorf("architecture %q is not a supported model (%s)", a, supported)
		case fam == "":
			fam = of
		case of != fam:
			return "", fmt.Errorf("architecture %q is a %s model, but config.json says %s", a, of, fam)
		}
	}
	if fam == "" {
		return "", fmt.Errorf("config.json names neither model_type nor architectures (%s)", supported)
	}
	return fam, nil
}

// keys is config.json's top-level object, each value undecoded.
type keys map[string]json.RawMessage

// names are a field's key in config.json for BERT and RoBERTa, then for
// GPT-2 (GPT2Config's own key first, then the BERT-style name its
// attribute_map also accepts).
type names struct{ bert, gpt2 []string }

// fill overwrites c's fields (set to its family's defaults) with the
// values config.json gives.
func (k keys) fill(c *Config) error {
	pick := func(n names) []string {
		if c.Family == GPT2 {
			return n.gpt2
		}
		return n.bert
	}
	ints := []struct {
		dst  *int
		keys names
	}{
		{&c.Hidden, names{[]string{"hidden_size"}, []string{"n_embd", "hidden_size"}}},
		{&c.Heads, names{[]string{"num_attention_heads"}, []string{"n_head", "num_attention_heads"}}},
		{&c.Layers, names{[]string{"num_hidden_layers"}, []string{"n_layer", "num_hidden_layers"}}},
		{&c.Intermediate, names{[]string{"intermediate_size"}, []string{"n_inner"}}},
		{&c.Vocab, names{[]string{"vocab_size"}, []string{"vocab_size"}}},
		{&c.MaxPositions, names{[]string{"max_position_embeddings"}, []string{"n_positions", "max_position_embeddings"}}},
		{&c.TypeVocab, names{[]string{"type_vocab_size"}, nil}},
	}
	for _, f := range ints {
		if err := k.int(f.dst, pick(f.keys)...); err != nil {
			return err
		}
	}
	if _, given := k["n_inner"]; c.Family == GPT2 && c.Intermediate == 0 && (!given || k.null("n_inner")) {
		c.Intermediate = 4 * c.Hidden // GPT2Block: n_inner if not None else 4 * hidden_size
	}
	var err error
	if c.LayerNormEps, err = k.float(c.LayerNormEps, pick(names{[]string{"layer_norm_eps"}, []string{"layer_norm_epsilon"}})...); err != nil {
		return err
	}
	if c.Activation, err = k.str(c.Activation, pick(names{[]string{"hidden_act"}, []string{"activation_function"}})...); err != nil {
		return err
	}
	if k.null("pad_token_id") {
		c.PadTokenID = -1
	} else if err := k.int(&c.PadTokenID, "pad_token_id"); err != nil {
		return err
	}
	if err := k.decode("tie_word_embeddings", &c.TieWordEmbeddings); err != nil {
		return err
	}
	if c.Family == RoBERTa && c.PadTokenID >= 0 {
		c.PositionOffset = c.PadTokenID + 1
	}
	if err := k.unsupported(c.Family); err != nil {
		return err
	}
	return k.labels(c)
}

// unsupported refuses the options that change a family's tensors or
// arithmetic in ways the Expected lists do not describe.
func (k keys) unsupported(fam Family) error {
	type flag struct {
		key  string
		want bool // the value the Expected lists assume, also the default
	}
	flags := []flag{{"add_cross_attention", false}}
	if fam == GPT2 {
		flags = append(flags, flag{"scale_attn_by_inverse_layer_idx", false}, flag{"scale_attn_weights", true})
	}
	for _, f := range flags {
		v := f.want
		if err := k.decode(f.key, &v); err != nil {
			return err
		}
		if v != f.want {
			return fmt.Errorf("%s is %v: not supported", f.key, v)
		}
	}
	if fam == GPT2 {
		return nil
	}
	kind, err := k.str("absolute", "position_embedding_type")
	if err == nil && kind != "absolute" {
		err = fmt.Errorf("position_embedding_type %q is not supported (only \"absolute\")", kind)
	}
	return err
}

// labels fills NumLabels and Labels from id2label and num_labels, as
// PretrainedConfig does: id2label decides when present (its keys, JSON
// strings, must be 0 … n−1); else num_labels; else the default 2. Both
// present and disagreeing is an error (PretrainedConfig only warns and
// keeps id2label).
func (k keys) labels(c *Config) error {
	var id2label map[string]string
	if err := k.decode("id2label", &id2label); err != nil {
		return err
	}
	if err := k.int(&c.NumLabels, "num_labels"); err != nil {
		return err
	}
	if id2label == nil {
		return nil
	}
	c.Labels = make([]string, len(id2label))
	for key, label := range id2label {
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(id2label) || strconv.Itoa(i) != key {
			return fmt.Errorf("id2label has key %q: the keys must be the ids 0 to %d", key, len(id2label)-1)
		}
		c.Labels[i] = label
	}
	if _, ok := k["num_labels"]; ok && c.NumLabels != len(id2label) {
		return fmt.Errorf("num_labels %d disagrees with id2label's %d labels", c.NumLabels, len(id2label))
	}
	c.NumLabels = len(id2label)
	return nil
}

// lookup returns the value of the first of the keys config.json holds, and
// that key; two of them holding different values is an error.
func (k keys) lookup(names ...string) (json.RawMessage, string, error) {
	var v json.RawMessage
	var at string
	for _, n := range names {
		w, ok := k[n]
		if !ok {
			continue
		}
		if at != "" && !jsonEqual(v, w) {
			return nil, "", fmt.Errorf("%s %s and %s %s disagree", at, v, n, w)
		}
		if at == "" {
			v, at = w, n
		}
	}
	return v, at, nil
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}

// null reports whether config.json holds null under name.
func (k keys) null(name string) bool { return string(k[name]) == "null" }

// int sets *dst to the integer under the first of the keys present; null
// sets 0 (Validate then reports the size as missing); absent leaves *dst.
func (k keys) int(dst *int, names ...string) error {
	v, at, err := k.lookup(names...)
	if err != nil || at == "" {
		return err
	}
	if string(v) == "null" {
		*dst = 0
		return nil
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return fmt.Errorf("%s is %s, not an integer", at, v)
	}
	*dst = int(f)
	return nil
}

// float returns the number under the first of the keys present, or def.
func (k keys) float(def float64, names ...string) (float64, error) {
	v, at, err := k.lookup(names...)
	if err != nil || at == "" {
		return def, err
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil {
		return 0, fmt.Errorf("%s is %s, not a number", at, v)
	}
	return f, nil
}

// str returns the string under the first of the keys present, or def.
func (k keys) str(def string, names ...string) (string, error) {
	v, at, err := k.lookup(names...)
	if err != nil || at == "" {
		return def, err
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("%s is %s, not a string", at, v)
	}
	return s, nil
}

// decode decodes the value under name into dst, leaving dst for an absent
// key or null.
func (k keys) decode(name string, dst any) error {
	v, ok := k[name]
	if !ok || string(v) == "null" {
		return nil
	}
	if err := json.Unmarshal(v, dst); err != nil {
		return fmt.Errorf("%s is %s: %v", name, v, err)
	}
	return nil
}

// Validate checks c: a known family; every size positive (a size config.json
// gives as null is missing, 0 here); the hidden size divisible by the
// number of heads; a positive, finite layer-norm epsilon; an activation
// the family's configuration documents; at least one label; a pad token
// inside the vocabulary; for RoBERTa, a pad token and more position rows
// than the offset. Errors are one line wrapping ErrConfig and use
// config.json's key names.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if _, ok := families[c.Family]; !ok {
		return bad("family %q is not one of bert, roberta, gpt2", c.Family)
	}
	g := c.Family == GPT2
	key := func(bert, gpt2 string) string {
		if g {
			return gpt2
		}
		return bert
	}
	type size struct {
		name string
		v    int
	}
	sizes := []size{
		{key("hidden_size", "n_embd"), c.Hidden},
		{key("num_attention_heads", "n_head"), c.Heads},
		{key("num_hidden_layers", "n_layer"), c.Layers},
		{key("intermediate_size", "n_inner"), c.Intermediate},
		{"vocab_size", c.Vocab},
		{key("max_position_embeddings", "n_positions"), c.MaxPositions},
	}
	if !g {
		sizes = append(sizes, size{"type_vocab_size", c.TypeVocab})
	}
	for _, s := range sizes {
		switch {
		case s.v == 0:
			return bad("%s is missing or 0", s.name)
		case s.v < 0:
			return bad("%s is %d, not positive", s.name, s.v)
		}
	}
	if c.Hidden%c.Heads != 0 {
		return bad("%s %d is not divisible by %s %d", key("hidden_size", "n_embd"), c.Hidden, key("num_attention_heads", "n_head"), c.Heads)
	}
	if !(c.LayerNormEps > 0) || math.IsInf(c.LayerNormEps, 0) {
		return bad("%s is %v, not a positive number", key("layer_norm_eps", "layer_norm_epsilon"), c.LayerNormEps)
	}
	if !slices.Contains(activations[c.Family], c.Activation) {
		return bad("%s %q is not an activation %s uses (%s)", key("hidden_act", "activation_function"), c.Activation, c.Family, strings.Join(activations[c.Family], ", "))
	}
	if c.NumLabels < 1 {
		return bad("num_labels is %d, not positive", c.NumLabels)
	}
	if c.Labels != nil && len(c.Labels) != c.NumLabels {
		return bad("id2label has %d labels, num_labels is %d", len(c.Labels), c.NumLabels)
	}
	if c.PadTokenID < -1 || c.PadTokenID >= c.Vocab {
		return bad("pad_token_id %d is outside the vocabulary of %d", c.PadTokenID, c.Vocab)
	}
	if c.Family == RoBERTa {
		if c.PadTokenID < 0 {
			return bad("pad_token_id is missing: RoBERTa numbers positions from it")
		}
		if c.PositionOffset != c.PadTokenID+1 {
			return bad("position offset %d, want pad_token_id+1 = %d", c.PositionOffset, c.PadTokenID+1)
		}
		if c.MaxPositions <= c.PositionOffset {
			return bad("max_position_embeddings %d leaves no position after the offset pad_token_id+1 = %d", c.MaxPositions, c.PositionOffset)
		}
	} else if c.PositionOffset != 0 {
		return bad("position offset %d: only RoBERTa has one", c.PositionOffset)
	}
	return nil
}

// MaxSequence returns the longest token sequence the position embedding
// covers: MaxPositions less the PositionOffset.
func (c Config) MaxSequence() int { return c.MaxPositions - c.PositionOffset }

package checkpoint_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/checkpoint"
)

// configDir writes config.json with the given text into a new folder.
func configDir(t *testing.T, text string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReadConfig reads configurations in the form save_pretrained writes
// for the three families' base checkpoints (bert-base-uncased,
// roberta-base, gpt2) and minimal ones that rely on the defaults.
func TestReadConfig(t *testing.T) {
	for _, c := range []struct {
		name, text string
		want       checkpoint.Config
	}{
		{"bert-base", `{
  "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": false,
  "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
  "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
  "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
  "transformers_version": "4.6.0.dev0", "type_vocab_size": 2, "use_cache": true, "vocab_size": 30522
}`, checkpoint.Config{Family: checkpoint.BERT, ModelType: "bert", Architectures: []string{"BertForMaskedLM"},
			Hidden: 768, Heads: 12, Layers: 12, Intermediate: 3072, Vocab: 30522, MaxPositions: 512, TypeVocab: 2,
			LayerNormEps: 1e-12, Activation: "gelu", PadTokenID: 0, TieWordEmbeddings: true, NumLabels: 2}},
		{"roberta-base", `{
  "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "eos_token_id": 2,
  "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
  "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "roberta",
  "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1, "type_vocab_size": 1, "vocab_size": 50265
}`, checkpoint.Config{Family: checkpoint.RoBERTa, ModelType: "roberta", Architectures: []string{"RobertaForMaskedLM"},
			Hidden: 768, Heads: 12, Layers: 12, Intermediate: 3072, Vocab: 50265, MaxPositions: 514, TypeVocab: 1,
			PositionOffset: 2, LayerNormEps: 1e-5, Activation: "gelu", PadTokenID: 1, TieWordEmbeddings: true, NumLabels: 2}},
		{"gpt2", `{
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
  "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
  "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
  "summary_type": "cls_index", "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}, "vocab_size": 50257
}`, checkpoint.Config{Family: checkpoint.GPT2, ModelType: "gpt2", Architectures: []string{"GPT2LMHeadModel"},
			Hidden: 768, Heads: 12, Layers: 12, Intermediate: 3072, Vocab: 50257, MaxPositions: 1024,
			LayerNormEps: 1e-5, Activation: "gelu_new", PadTokenID: -1, TieWordEmbeddings: true, NumLabels: 2}},
		{"gpt2 defaults, n_inner null", `{"model_type": "gpt2", "n_embd": 48, "n_inner": null}`,
			checkpoint.Config{Family: checkpoint.GPT2, ModelType: "gpt2", Hidden: 48, Heads: 12, Layers: 12, Intermediate: 192,
				Vocab: 50257, MaxPositions: 1024, LayerNormEps: 1e-5, Activation: "gelu_new", PadTokenID: -1, TieWordEmbeddings: true, NumLabels: 2}},
		{"gpt2 with BERT-style names, n_inner set, untied", `{"architectures": ["GPT2ForSequenceClassification"], "hidden_size": 64, "n_head": 4,
  "num_hidden_layers": 2, "n_inner": 100, "max_position_embeddings": 32, "pad_token_id": 50256, "tie_word_embeddings": false,
  "id2label": {"1": "POSITIVE", "0": "NEGATIVE", "2": "NEUTRAL"}}`,
			checkpoint.Config{Family: checkpoint.GPT2, Architectures: []string{"GPT2ForSequenceClassification"}, Hidden: 64, Heads: 4, Layers: 2,
				Intermediate: 100, Vocab: 50257, MaxPositions: 32, LayerNormEps: 1e-5, Activation: "gelu_new", PadTokenID: 50256,
				NumLabels: 3, Labels: []string{"NEGATIVE", "POSITIVE", "NEUTRAL"}}},
		{"roberta defaults", `{"model_type": "roberta", "num_labels": 5}`,
			checkpoint.Config{Family: checkpoint.RoBERTa, ModelType: "roberta", Hidden: 768, Heads: 12, Layers: 12, Intermediate: 3072,
				Vocab: 30522, MaxPositions: 512, TypeVocab: 2, PositionOffset: 2, LayerNormEps: 1e-12, Activation: "gelu",
				PadTokenID: 1, TieWordEmbeddings: true, NumLabels: 5}},
		{"architectures only", `{"architectures": ["BertForSequenceClassification"], "pad_token_id": null}`,
			checkpoint.Config{Family: checkpoint.BERT, Architectures: []string{"BertForSequenceClassification"}, Hidden: 768, Heads: 12, Layers: 12,
				Intermediate: 3072, Vocab: 30522, MaxPositions: 512, TypeVocab: 2, LayerNormEps: 1e-12, Activation: "gelu",
				PadTokenID: -1, TieWordEmbeddings: true, NumLabels: 2}},
	} {
		got, err := checkpoint.ReadConfig(configDir(t, c.text))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

// TestMaxSequence checks RoBERTa's position offset: roberta-base's 514
// position rows hold 512 tokens.
func TestMaxSequence(t *testing.T) {
	c, err := checkpoint.ReadConfig(configDir(t, `{"model_type": "roberta", "max_position_embeddings": 514}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.MaxSequence(); got != 512 {
		t.Fatalf("MaxSequence() = %d, want 512", got)
	}
}

// TestConfigErrors checks that each bad configuration is one line that
// says what is wrong and wraps the right sentinel.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name, text string
		want       string
	}{
		{"not JSON", "{\n  \"model_type\": \"bert\",\n  oops\n}", "line 3: invalid character 'o'"},
		{"not an object", `["bert"]`, "cannot unmarshal array"},
		{"unknown model_type", `{"model_type": "llama"}`, `model_type "llama" is not a supported model (supported: model_type bert, roberta or gpt2, architectures BertModel, BertForPreTraining`},
		{"unknown architecture", `{"architectures": ["LlamaForCausalLM"]}`, `architecture "LlamaForCausalLM" is not a supported model (supported: model_type bert, roberta or gpt2`},
		{"a derived family", `{"architectures": ["RobertaPreLayerNormForMaskedLM"]}`, `architecture "RobertaPreLayerNormForMaskedLM" is not a supported model`},
		{"architecture of another family", `{"model_type": "bert", "architectures": ["GPT2LMHeadModel"]}`, `architecture "GPT2LMHeadModel" is a gpt2 model, but config.json says bert`},
		{"no family at all", `{"hidden_size": 8}`, "config.json names neither model_type nor architectures"},
		{"model_type not a string", `{"model_type": 3}`, "model_type is 3, not a string"},
		{"null size", `{"model_type": "bert", "hidden_size": null}`, "hidden_size is missing or 0"},
		{"zero heads", `{"model_type": "gpt2", "n_head": 0}`, "n_head is missing or 0"},
		{"negative layers", `{"model_type": "bert", "num_hidden_layers": -1}`, "num_hidden_layers is -1, not positive"},
		{"zero type vocabulary", `{"model_type": "roberta", "type_vocab_size": 0}`, "type_vocab_size is missing or 0"},
		{"size not an integer", `{"model_type": "bert", "hidden_size": 76.8}`, "hidden_size is 76.8, not an integer"},
		{"size a string", `{"model_type": "bert", "vocab_size": "30522"}`, `vocab_size is "30522", not an integer`},
		{"heads do not divide", `{"model_type": "bert", "hidden_size": 768, "num_attention_heads": 5}`, "hidden_size 768 is not divisible by num_attention_heads 5"},
		{"gpt2 heads do not divide", `{"model_type": "gpt2", "n_embd": 100, "n_head": 12}`, "n_embd 100 is not divisible by n_head 12"},
		{"aliases disagree", `{"model_type": "gpt2", "n_embd": 768, "hidden_size": 512}`, "n_embd 768 and hidden_size 512 disagree"},
		{"bert activation", `{"model_type": "bert", "hidden_act": "quick_gelu"}`, `hidden_act "quick_gelu" is not an activation bert uses (gelu, relu, silu, gelu_new)`},
		{"gpt2 activation", `{"model_type": "gpt2", "activation_function": "swish"}`, `activation_function "swish" is not an activation gpt2 uses (relu, silu, gelu, tanh, gelu_new)`},
		{"zero epsilon", `{"model_type": "bert", "layer_norm_eps": 0}`, "layer_norm_eps is 0, not a positive number"},
		{"pad outside the vocabulary", `{"model_type": "bert", "pad_token_id": 30522}`, "pad_token_id 30522 is outside the vocabulary of 30522"},
		{"roberta without a pad token", `{"model_type": "roberta", "pad_token_id": null}`, "pad_token_id is missing: RoBERTa numbers positions from it"},
		{"roberta without positions", `{"model_type": "roberta", "max_position_embeddings": 2}`, "max_position_embeddings 2 leaves no position after the offset pad_token_id+1 = 2"},
		{"relative positions", `{"model_type": "bert", "position_embedding_type": "relative_key"}`, `position_embedding_type "relative_key" is not supported`},
		{"cross-attention", `{"model_type": "gpt2", "add_cross_attention": true}`, "add_cross_attention is true: not supported"},
		{"scaled by layer", `{"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": true}`, "scale_attn_by_inverse_layer_idx is true: not supported"},
		{"unscaled attention", `{"model_type": "gpt2", "scale_attn_weights": false}`, "scale_attn_weights is false: not supported"},
		{"id2label gaps", `{"model_type": "bert", "id2label": {"0": "a", "2": "b"}}`, `id2label has key "2": the keys must be the ids 0 to 1`},
		{"id2label not ids", `{"model_type": "bert", "id2label": {"x": "a"}}`, `id2label has key "x"`},
		{"labels disagree", `{"model_type": "bert", "num_labels": 2, "id2label": {"0": "a", "1": "b", "2": "c"}}`, "num_labels 2 disagrees with id2label's 3 labels"},
		{"no labels", `{"model_type": "bert", "num_labels": 0}`, "num_labels is 0, not positive"},
	} {
		_, err := checkpoint.ReadConfig(configDir(t, c.text))
		switch {
		case err == nil:
			t.Errorf("%s: accepted", c.name)
		case !errors.Is(err, checkpoint.ErrConfig):
			t.Errorf("%s: %v does not wrap ErrConfig", c.name, err)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %q does not say %q", c.name, err, c.want)
		case strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: %q is more than one line", c.name, err)
		}
	}
}

// TestNoConfig checks the error for a folder without config.json: it says
// what the folder holds instead.
func TestNoConfig(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"model.safetensors", "vocab.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "onnx"), 0o755); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	for _, c := range []struct {
		dir, want string
	}{
		{dir, "checkpoint: no config.json in " + dir + ": the folder holds model.safetensors, onnx/, vocab.txt"},
		{empty, "the folder is empty"},
		{filepath.Join(dir, "model.safetensors"), "it is a file, not a checkpoint folder"},
		{filepath.Join(dir, "missing"), "no such file or directory"},
	} {
		_, err := checkpoint.ReadConfig(c.dir)
		if !errors.Is(err, checkpoint.ErrNoConfig) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ReadConfig(%s) = %v, want one line with %q", c.dir, err, c.want)
		}
	}
}

// TestValidateStruct checks Validate on a Config built in code: zero
// values are missing sizes, an unknown family is refused.
func TestValidateStruct(t *testing.T) {
	for _, c := range []struct {
		cfg  checkpoint.Config
		want string
	}{
		{checkpoint.Config{}, `family "" is not one of bert, roberta, gpt2`},
		{checkpoint.Config{Family: checkpoint.BERT}, "hidden_size is missing or 0"},
		{checkpoint.Config{Family: checkpoint.BERT, Hidden: 8, Heads: 2, Layers: 1, Intermediate: 16, Vocab: 10, MaxPositions: 4,
			TypeVocab: 1, LayerNormEps: 1e-12, Activation: "gelu", NumLabels: 2, PositionOffset: 1}, "position offset 1: only RoBERTa has one"},
	} {
		err := c.cfg.Validate()
		if !errors.Is(err, checkpoint.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}

// Package checkpoint reads pretrained checkpoints as Hugging Face
// transformers saves them with save_pretrained: a folder with config.json
// and model.safetensors, for BERT-, RoBERTa- and GPT-2-style models. It
// checks a checkpoint against what a model expects before any weight is
// read, then reads each tensor into the caller's buffer:
//
//	cfg, err := checkpoint.ReadConfig(dir)         // config.json, defaults filled, validated
//	f, err := checkpoint.Open(dir + "/model.safetensors") // header and layout checked
//	defer f.Close()
//	want := cfg.Expected(checkpoint.HeadClassifier) // names and shapes of the model's tensors
//	r, err := checkpoint.Check(f, want)            // missing, misshapen, fresh, unexpected
//	for _, s := range r.Present {
//		err = f.ReadFloat32(s.File, view(theta, s.Name)) // into θ, converted to float32
//	}
//	// r.Fresh: initialize afresh (a new classification head); r.Tied:
//	// share the tensor named by Expected.TiedTo.
//
// # Reading
//
// Open validates the whole safetensors header first (NewFile lists the
// checks, taken from the format's definition and its reference
// implementation): a file that is truncated, whose byte ranges overlap or
// leave a gap, or whose shapes do not match their ranges is refused with
// one line wrapping ErrFormat, before anything is read. ReadFloat32 then
// converts F32, F16, BF16 (exactly, subnormals, infinities and NaNs
// included) and F64 (rounded to nearest, ties to even) into the caller's
// slice, reading the file through io.ReaderAt in chunks of at most 1 MiB:
// a 440 MB BERT-base checkpoint costs θ plus 1 MiB, never two copies. A
// File is safe for concurrent use.
//
// # Configuration
//
// ReadConfig normalizes the families' key names (GPT-2's n_embd is
// BERT's hidden_size, and so on) into one Config, fills the keys
// config.json omits with the defaults of BertConfig, RobertaConfig and
// GPT2Config, and refuses, in one line wrapping ErrConfig or ErrNoConfig,
// what the package cannot describe: an unknown model_type or architecture,
// missing or non-positive sizes, heads that do not divide the hidden size,
// an activation the family does not use, options that change the
// tensors (cross-attention, relative positions).
//
// # Checking
//
// Config.Expected lists every parameter of the base model and the chosen
// head with the names and shapes transformers gives them (GPT-2's Conv1D
// weights stored [in, out], marked Transposed), plus the buffers older
// checkpoints hold (position_ids, GPT-2's attn.bias): Check accepts those
// as known non-parameters. Check matches names with or without the base
// model's prefix ("bert.", "roberta.", "transformer."), since a bare base
// model's checkpoint (openai-community/gpt2) leaves it out.
//
// Sources: the format from huggingface/safetensors (README "Format",
// safetensors/src/tensor.rs); config keys and defaults from transformers'
// configuration_bert.py, configuration_roberta.py, configuration_gpt2.py;
// tensor names and shapes from modeling_bert.py, modeling_roberta.py,
// modeling_gpt2.py and pytorch_utils.py (Conv1D). The commits read are
// named where each is used.
package checkpoint

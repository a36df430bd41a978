// Package pretrained imports a pretrained transformer saved by Hugging Face
// transformers (a folder with config.json and model.safetensors) into the
// engine of package model, and exports a fine-tuned θ back under the
// checkpoint's own names, so a PyTorch user loads the result where the
// checkpoint came from.
//
//	ck, err := pretrained.Open(dir, pretrained.Options{SeqLen: 128, Classes: 3})
//	defer ck.Close()
//	m, err := model.New(ck.Spec())     // BERT or GPT-2 with a classification head
//	theta := make([]float32, m.NumParams())
//	err = ck.Init(theta, seed)         // θ₀: the checkpoint, a fresh head from seed
//	// … train …
//	err = ck.Export(out, theta, labels, nil) // out/config.json, out/model.safetensors
//
// # Architectures
//
// SpecFor builds the engine's spec from the configuration:
//
//   - BERT (BertForSequenceClassification): word, position and token-type
//     embeddings with a layer norm; post-layer-norm blocks with
//     bidirectional attention over the tokens that are not padding and the
//     configured activation (GELU, erf form); the pooler, tanh of a
//     linear map of the first token; a linear classifier. The token types
//     are read from the positions of [SEP] (model.LayerSpec.TypeSep), as
//     BERT's tokenizer assigns them for [CLS] a [SEP] b [SEP].
//   - GPT-2 (GPT2ForSequenceClassification): token and position
//     embeddings; pre-layer-norm blocks with causal attention and GELU
//     (tanh form); the final layer norm; score, a linear map without bias
//     of the last token that is not padding.
//
// Neither has dropout: the engine has none, and a model fine-tuned under
// differential privacy is trained and evaluated the way transformers
// evaluates it (model.eval()). The engine fuses BERT's query, key and
// value into one linear map (the three weights stacked); GPT-2 stores
// them fused already, its Conv1D weights transposed ([in, out]). RoBERTa
// configurations are read by package checkpoint but not built here: its
// tokenizer's <s> … </s> framing is not one of the dataset's tokenizers.
//
// # Import
//
// Open reads config.json, checks every tensor of model.safetensors
// against the names and shapes the model expects (checkpoint.Check: a
// missing tensor or a wrong shape is refused with both shapes; tensors
// the model does not use are listed in Report.Unexpected and ignored; a
// classification head the checkpoint lacks is listed in Report.Fresh and
// initialized by the engine from the run's seed) and hashes the weights
// file. The hash identifies the weights: the run records it, and every
// replica and node must import the same bytes. Init reads the weights
// tensor by tensor into θ, so a checkpoint is never held twice in memory.
//
// # Export
//
// Mapping.Tensors inverts the mapping for any vector in the engine's
// layout (θ, a gradient); Export writes θ that way with config.json
// amended for the classification head (architectures, num_labels,
// id2label). Sources: tensor names and layouts from modeling_bert.py,
// modeling_gpt2.py and pytorch_utils.py of transformers, as package
// checkpoint cites them.
package pretrained

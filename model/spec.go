package model

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Layer type names accepted in a LayerSpec.
const (
	Linear       = "linear"
	ReLU         = "relu"
	Tanh         = "tanh"
	Conv2D       = "conv2d"
	MaxPool      = "maxpool"
	AvgPool      = "avgpool"
	Flatten      = "flatten"
	EmbeddingBag = "embeddingbag"
	LayerNorm    = "layernorm"
	Embedding    = "embedding"
	Attention    = "attention"
	Residual     = "residual"
	MeanPool     = "meanpool"
	// GELU is x·Φ(x) with Φ the standard normal CDF (the erf form;
	// Hugging Face's "gelu", BERT's activation).
	GELU = "gelu"
	// GELUTanh is GELU's tanh approximation
	// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (Hugging Face's
	// "gelu_new", GPT-2's activation).
	GELUTanh = "gelu_tanh"
	// FirstToken takes position 0 of a sequence (BERT's pooler input).
	FirstToken = "firsttoken"
	// LastToken takes the last position of a sequence whose input token is
	// not padding (GPT-2's sequence classification).
	LastToken = "lasttoken"
)

// Attention masks accepted in LayerSpec.Mask.
const (
	// MaskCausal lets position t attend to positions u ≤ t; "" means the
	// same.
	MaskCausal = "causal"
	// MaskPadding lets every position attend to every position whose
	// input token is not padding (BERT's attention_mask).
	MaskPadding = "padding"
)

// Loss names accepted in Spec.Loss.
const (
	SoftmaxCrossEntropy = "softmax_cross_entropy"
	// NextToken is next-token prediction (see Spec.Loss).
	NextToken = "next_token"
)

// ErrInvalidSpec is returned (wrapped, naming the offending layer) when a
// model spec is malformed or its shapes do not fit together.
var ErrInvalidSpec = errors.New("model: invalid spec")

// Spec describes a model: a per-example input shape, a stack of layers and a
// loss. It is plain data, encoded as JSON; its Hash identifies the model on
// the wire. Shapes are written the PyTorch way: images are [C, H, W] and a
// conv weight is [out, in, kh, kw]; a linear weight is [out, in].
type Spec struct {
	// Name is informational (it is part of the hash).
	Name string `json:"name,omitempty"`
	// Input is the per-example input shape: [D] for vectors and token
	// sequences, [C, H, W] for images.
	Input []int `json:"input"`
	// Classes is the number of output classes; the last layer must produce
	// [Classes] values.
	Classes int `json:"classes"`
	// Loss is the loss name; "" means SoftmaxCrossEntropy. With NextToken
	// one example is one sequence: Input is [T+1] token ids (float32
	// integers below Classes, -1 = padding), the layers see ids 0..T-1,
	// the first layer must be an embedding with Vocab = Classes and the
	// last must output [T, Classes]; position t's target is id t+1, and
	// the example's loss is the mean softmax cross-entropy over its
	// targets that are not padding (zero if all are). Labels are ignored
	// (callers pass 0).
	Loss string `json:"loss,omitempty"`
	// Layers are applied in order.
	Layers []LayerSpec `json:"layers"`
	// Trainable and Freeze choose the parameters that train; the others
	// are frozen: read from fixed values (Model.WithFrozen) and never
	// part of the parameter vector. Each is a list of patterns over
	// parameter names in the syntax of path.Match ("layer.11.*",
	// "classifier.*"). A parameter trains if Trainable is empty or one of
	// its patterns matches it, and no Freeze pattern does. A layer trains
	// whole or not at all (a pattern that splits a layer's parameters is
	// an error), and every pattern must match some parameter. Both empty:
	// every parameter trains.
	Trainable []string `json:"trainable,omitempty"`
	Freeze    []string `json:"freeze,omitempty"`
}

// LayerSpec is one layer. Which fields matter depends on Type:
//
//	linear:       Out, NoBias (weight [Out, in], bias [Out], no bias with
//	              NoBias); input must be flat
//	relu, tanh,
//	gelu,
//	gelu_tanh:    none; elementwise, any shape
//	conv2d:       Out channels, Kernel, Stride (default 1), Pad (default 0);
//	              weight [Out, C, Kernel, Kernel], bias [Out]; input [C, H, W]
//	maxpool,
//	avgpool:      Kernel, Stride (default Kernel); no padding; input [C, H, W]
//	flatten:      none; [C, H, W] becomes [C*H*W] in C, H, W order
//	embeddingbag: Vocab, Dim (weight [Vocab, Dim]); must be the first layer;
//	              input [L] token ids (float32 integers, -1 = padding);
//	              output is the mean embedding of the non-padding tokens
//	              (zero if there are none)
//	layernorm:    Eps (default 1e-5); gain and bias [F] over the whole flat
//	              input [F], or over each position of a sequence [T, F]
//
// Sequence layers (activations [T, D]: T positions of D values):
//
//	embedding:    Vocab, Dim, Positions, PosOffset, Types, TypeSep; must be
//	              the first layer; input [T] token ids (-1 = padding,
//	              embedded as zero); output [T, Dim]: row t is the token's
//	              embedding plus row t+PosOffset of a learned position
//	              table plus, with Types > 0, the row of its token type
//	              (parameters weight [Vocab, Dim], pos [Positions, Dim],
//	              types [Types, Dim], in that order)
//	linear:       on a [T, D] input, the same map at every position:
//	              weight [Out, D], bias [Out] (none with NoBias), output
//	              [T, Out]
//	attention:    Heads, Mask; multi-head self-attention without
//	              parameters, causal or over the positions that are not
//	              padding (Mask): input [T, 3D] holds each position's
//	              query, key and value (D = Heads·head size), output
//	              [T, D]; put linear layers before (3D) and after (D) it
//	residual:     Layers; y = x + f(x), f the nested layers, whose output
//	              shape must equal the input's
//	meanpool:     none; [T, D] becomes the mean over positions [D]
//	firsttoken:   none; [T, D] becomes position 0 [D]
//	lasttoken:    none; [T, D] becomes the last position whose input token
//	              is not padding (position 0 if all are) [D]; needs an
//	              embedding first layer
//	relu, tanh,
//	gelu,
//	gelu_tanh:    elementwise, any shape
//
// A field the layer's type does not use is an error naming the field.
type LayerSpec struct {
	Type string `json:"type"`
	// Name prefixes the layer's parameter names ("<name>.weight"); default
	// is the layer index ("3.weight").
	Name   string  `json:"name,omitempty"`
	Out    int     `json:"out,omitempty"`
	Kernel int     `json:"kernel,omitempty"`
	Stride int     `json:"stride,omitempty"`
	Pad    int     `json:"pad,omitempty"`
	Vocab  int     `json:"vocab,omitempty"`
	Dim    int     `json:"dim,omitempty"`
	Eps    float64 `json:"eps,omitempty"`
	Heads  int     `json:"heads,omitempty"`
	// Layers are the nested layers of a residual block.
	Layers []LayerSpec `json:"layers,omitempty"`
	// Mask is an attention's mask: "" or MaskCausal, causal attention;
	// MaskPadding, bidirectional attention over the positions whose
	// model-input token is not padding (a query with no such key outputs
	// zeros), which needs an embedding first layer.
	Mask string `json:"mask,omitempty"`
	// NoBias leaves out a linear layer's bias: its only parameter is
	// weight (GPT-2's classification head).
	NoBias bool `json:"no_bias,omitempty"`
	// Positions is the number of rows of an embedding's position table
	// (Hugging Face's max_position_embeddings); 0 means T, the input
	// length. It must be at least T + PosOffset; the rows outside
	// PosOffset..PosOffset+T−1 are not used and get zero gradient.
	Positions int `json:"positions,omitempty"`
	// PosOffset is the position table row of an embedding's position 0:
	// position t uses row t + PosOffset (RoBERTa's is 2).
	PosOffset int `json:"pos_offset,omitempty"`
	// Types is the number of rows of an embedding's token-type (segment)
	// table, added at every position (BERT's token_type_embeddings); 0
	// means no table.
	Types int `json:"types,omitempty"`
	// TypeSep is the token id that ends a segment ([SEP]): position t has
	// type min(number of TypeSep ids at positions before t, Types−1), so
	// "[CLS] a [SEP] b [SEP]" gets types 0 0 0 1 1, BERT's
	// token_type_ids; padding positions follow the same rule. Required
	// when Types ≥ 2 and refused otherwise.
	TypeSep *int `json:"type_sep,omitempty"`
	// LoRA adds low-rank adapters to a linear layer on a sequence; its
	// weight and bias are then frozen (see LoRA).
	LoRA *LoRA `json:"lora,omitempty"`
}

// maxElems bounds every tensor and activation size so index arithmetic
// cannot overflow and a hostile spec cannot ask for absurd memory.
const maxElems = 1 << 31

// ParseSpec decodes a JSON spec, rejecting unknown fields, and validates it.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	if dec.More() {
		return Spec{}, fmt.Errorf("%w: trailing data after the spec", ErrInvalidSpec)
	}
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// Validate checks the spec and infers every layer's shape; errors wrap
// ErrInvalidSpec and name the layer and shapes involved.
func (s Spec) Validate() error {
	_, err := plan(s)
	return err
}

// normalized returns a copy with defaults filled in, so that equivalent
// specs hash equally.
func (s Spec) normalized() Spec {
	out := s
	out.Input = append([]int(nil), s.Input...)
	if out.Loss == "" {
		out.Loss = SoftmaxCrossEntropy
	}
	out.Layers = normalizedLayers(s.Layers)
	out.Trainable = slices.Clone(s.Trainable)
	out.Freeze = slices.Clone(s.Freeze)
	return out
}

// normalizedLayers returns a deep copy of ls with defaults filled in.
func normalizedLayers(ls []LayerSpec) []LayerSpec {
	out := append([]LayerSpec(nil), ls...)
	for i := range out {
		l := &out[i]
		if l.Layers != nil {
			l.Layers = normalizedLayers(l.Layers)
		}
		if l.TypeSep != nil {
			sep := *l.TypeSep
			l.TypeSep = &sep
		}
		if l.LoRA != nil {
			lr := *l.LoRA
			lr.Parts = slices.Clone(lr.Parts)
			if lr.Alpha == 0 {
				lr.Alpha = float64(lr.Rank)
			}
			l.LoRA = &lr
		}
		// An attention's Mask "" and an embedding's Positions 0 stay as
		// they are rather than being written out ("causal", T): specs
		// from before those fields existed keep their hashes.
		switch l.Type {
		case Conv2D:
			if l.Stride == 0 {
				l.Stride = 1
			}
		case MaxPool, AvgPool:
			if l.Stride == 0 {
				l.Stride = l.Kernel
			}
		case LayerNorm:
			if l.Eps == 0 {
				l.Eps = 1e-5
			}
		}
	}
	return out
}

// CanonicalJSON returns the normalized spec (defaults filled in) as JSON
// with object keys sorted and no insignificant whitespace.
func (s Spec) CanonicalJSON() ([]byte, error) {
	raw, err := json.Marshal(s.normalized())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	// Round-trip through generic values: encoding/json writes map keys
	// sorted, which makes the encoding independent of struct field order.
	var generic any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	return json.Marshal(generic)
}

// Hash returns the hex SHA-256 of CanonicalJSON. Nodes and the coordinator
// compare hashes to check that they run the same model. It returns an error
// only for specs that cannot be encoded (non-finite Eps).
func (s Spec) Hash() (string, error) {
	b, err := s.CanonicalJSON()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// shapeSize returns the product of dims, or -1 if a dim is non-positive or
// the product exceeds maxElems.
func shapeSize(dims []int) int {
	n := 1
	for _, d := range dims {
		if d < 1 || d > maxElems || n > maxElems/d {
			return -1
		}
		n *= d
	}
	return n
}

// Presets returns the names accepted by Preset.
func Presets() []string { return []string{"logreg", "mlp", "cnn", "textbag", "transformer"} }

// Preset returns a built-in spec for Fashion-MNIST-shaped data
// ([1, 28, 28] inputs, 10 classes); "textbag" uses a 10000-token
// vocabulary, 64-dimensional embeddings, 64 hidden units, 4 classes and
// sequences of 128 tokens; "transformer" is a next-token language model
// (TransformerLM) over a 2048-token vocabulary with context 64, width 128,
// 2 blocks and 4 heads (about 0.93M parameters). PresetFor shapes a preset
// for other data; the constructors (LogReg, MLP, CNN, TextBag,
// TransformerLM, TransformerClassifier) build other sizes.
func Preset(name string) (Spec, error) {
	switch name {
	case "textbag":
		return TextBag(10000, 64, 64, 4, 128), nil
	case "transformer":
		return TransformerLM(2048, 64, 128, 2, 4), nil
	}
	return PresetFor(name, []int{1, 28, 28}, 10, 0)
}

// PresetFor returns the preset name shaped by the data it is to train on:
// its per-example input shape, number of classes and, for token data, its
// vocabulary (0 for numeric features). logreg and mlp take any input
// (flattened; mlp has two hidden layers of 256); cnn needs images
// ([C, H, W], at least 8×8 for its first 8×8 convolution); textbag needs
// token sequences ([L] with vocab > 0; 64-dimensional embeddings, 64
// hidden units); transformer needs token sequences of shape [T+1] (T ≥ 1)
// and is a next-token model over the data's vocabulary (classes are not
// used: its outputs are the vocabulary). An input the preset cannot take is
// an error naming the preset, the shape and what it needs.
func PresetFor(name string, input []int, classes, vocab int) (Spec, error) {
	bad := func(format string, args ...any) (Spec, error) {
		return Spec{}, fmt.Errorf("%w: preset %s: %s", ErrInvalidSpec, name, fmt.Sprintf(format, args...))
	}
	if classes < 1 && name != "transformer" {
		return bad("%d classes: the data needs at least 1", classes)
	}
	if shapeSize(input) < 1 {
		return bad("input shape %v is not a shape", input)
	}
	switch name {
	case "transformer":
		if vocab < 1 || len(input) != 1 || input[0] < 2 {
			return bad("needs token sequences of shape [T+1] with T ≥ 1 and a vocabulary (next-token prediction); the data has shape %v and vocabulary %d", input, vocab)
		}
		return TransformerLM(vocab, input[0]-1, 128, 2, 4), nil
	case "logreg", "mlp", "cnn":
		if vocab > 0 {
			return bad("the data is token sequences (vocabulary %d): use --model textbag or a spec with an embedding", vocab)
		}
	}
	switch name {
	case "logreg":
		return LogReg(input, classes), nil
	case "mlp":
		return MLP(input, []int{256, 256}, classes), nil
	case "cnn":
		if len(input) != 3 || input[1] < 8 || input[2] < 8 {
			return bad("needs images of shape [C, H, W] with H, W ≥ 8; the data has shape %v (use --model mlp, or --input-shape for an image folder)", input)
		}
		return CNN(input, classes), nil
	case "textbag":
		if vocab < 1 || len(input) != 1 {
			return bad("needs token sequences (shape [L] and a vocabulary); the data has shape %v and vocabulary %d "+
				"(text: a folder of .txt documents per class, which the hashing tokenizer turns into tokens)", input, vocab)
		}
		return TextBag(vocab, 64, 64, classes, input[0]), nil
	}
	return Spec{}, fmt.Errorf("%w: unknown preset %q (have %v)", ErrInvalidSpec, name, Presets())
}

// LogReg is multinomial logistic regression: flatten → linear.
func LogReg(input []int, classes int) Spec {
	return Spec{Name: "logreg", Input: append([]int(nil), input...), Classes: classes, Layers: []LayerSpec{
		{Type: Flatten}, {Type: Linear, Out: classes},
	}}
}

// MLP is flatten → (linear → ReLU)* → linear; MLP([1,28,28], []int{256,256}, 10)
// is the "mlp" preset (784-256-256-10).
func MLP(input []int, hidden []int, classes int) Spec {
	layers := []LayerSpec{{Type: Flatten}}
	for _, h := range hidden {
		layers = append(layers, LayerSpec{Type: Linear, Out: h}, LayerSpec{Type: ReLU})
	}
	layers = append(layers, LayerSpec{Type: Linear, Out: classes})
	return Spec{Name: "mlp", Input: append([]int(nil), input...), Classes: classes, Layers: layers}
}

// CNN is the tanh convolutional network of Papernot, Thakurta, Song, Chien
// and Erlingsson, "Tempered Sigmoid Activations for Deep Learning with
// Differential Privacy" (AAAI 2021), for 28×28 inputs: conv 16 8×8 stride 2
// pad 3 → tanh → maxpool 2 stride 1 → conv 32 4×4 stride 2 → tanh →
// maxpool 2 stride 1 → flatten → linear 32 → tanh → linear classes.
func CNN(input []int, classes int) Spec {
	return Spec{Name: "cnn", Input: append([]int(nil), input...), Classes: classes, Layers: []LayerSpec{
		{Type: Conv2D, Out: 16, Kernel: 8, Stride: 2, Pad: 3},
		{Type: Tanh},
		{Type: MaxPool, Kernel: 2, Stride: 1},
		{Type: Conv2D, Out: 32, Kernel: 4, Stride: 2},
		{Type: Tanh},
		{Type: MaxPool, Kernel: 2, Stride: 1},
		{Type: Flatten},
		{Type: Linear, Out: 32},
		{Type: Tanh},
		{Type: Linear, Out: classes},
	}}
}

// TextBag is a bag-of-embeddings text classifier: embedding bag (mean of
// token embeddings) → linear hidden → ReLU → linear classes, over token
// sequences of length seqLen.
func TextBag(vocab, embed, hidden, classes, seqLen int) Spec {
	return Spec{Name: "textbag", Input: []int{seqLen}, Classes: classes, Layers: []LayerSpec{
		{Type: EmbeddingBag, Vocab: vocab, Dim: embed},
		{Type: Linear, Out: hidden},
		{Type: ReLU},
		{Type: Linear, Out: classes},
	}}
}

func validEps(e float64) bool { return e > 0 && e < 1 && !math.IsNaN(e) }

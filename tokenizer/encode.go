package tokenizer

import (
	"errors"
	"fmt"
)

// Errors, each returned wrapped with the details (test with errors.Is).
var (
	// ErrVocab is returned for a vocabulary file that is empty,
	// unreadable as its format, or lacks a token the tokenizer needs
	// (a special token, a byte's symbol).
	ErrVocab = errors.New("tokenizer: invalid vocabulary")
	// ErrMerges is returned for a merges file that is empty, has a line
	// that is not two symbols, or names a symbol (or a merged pair) the
	// vocabulary lacks.
	ErrMerges = errors.New("tokenizer: invalid merges")
	// ErrVocabSize is returned by CheckVocabSize for a model whose
	// vocabulary size is not the tokenizer's.
	ErrVocabSize = errors.New("tokenizer: vocabulary size mismatch")
	// ErrConfig is returned for a configuration that cannot encode.
	ErrConfig = errors.New("tokenizer: invalid configuration")
)

// Encoding is one model input of a fixed length (the configuration's
// MaxLen): the token ids, each position's segment (token type) and the
// attention mask, 1 on a token and 0 on padding. Its slices are the
// caller's.
type Encoding struct {
	InputIDs      []int32
	TokenTypeIDs  []int32
	AttentionMask []int32
	// Truncated is the number of the texts' tokens that truncation
	// dropped to fit MaxLen.
	Truncated int
}

// builder fills an Encoding from its start.
type builder struct {
	e Encoding
	n int
}

// newBuilder returns a builder of an encoding of maxLen positions, all
// padding (pad's id, type 0, mask 0) until put.
func newBuilder(maxLen int, pad int32) *builder {
	b := &builder{e: Encoding{
		InputIDs:      make([]int32, maxLen),
		TokenTypeIDs:  make([]int32, maxLen),
		AttentionMask: make([]int32, maxLen),
	}}
	for i := range b.e.InputIDs {
		b.e.InputIDs[i] = pad
	}
	return b
}

// put writes the next token: its id, its type, mask 1.
func (b *builder) put(id, typ int32) {
	b.e.InputIDs[b.n], b.e.TokenTypeIDs[b.n], b.e.AttentionMask[b.n] = id, typ, 1
	b.n++
}

// putAll writes ids, each of type typ.
func (b *builder) putAll(ids []int32, typ int32) {
	for _, id := range ids {
		b.put(id, typ)
	}
}

// Len returns the number of tokens before the padding.
func (e Encoding) Len() int {
	n := 0
	for _, m := range e.AttentionMask {
		n += int(m)
	}
	return n
}

// LongestFirst returns how many tokens to keep of two sequences of na and
// nb tokens so that together they fit in budget, cutting the longer one
// first: when the shorter fits in half the budget it is kept whole and
// the longer gets the rest; otherwise each gets half, the longer the odd
// token (the second when they are as long). This is Hugging Face's
// "longest_first" truncation of a pair as its tokenizers library computes
// it (truncate_encodings in tokenizers/src/utils/truncation.rs), which
// BertTokenizerFast and GPT2TokenizerFast use. Pairs that already fit are
// kept whole.
func LongestFirst(na, nb, budget int) (keepA, keepB int) {
	budget = max(budget, 0)
	if na+nb <= budget {
		return na, nb
	}
	short, long := na, nb
	if na > nb {
		short, long = nb, na
	}
	if 2*short <= budget {
		long = budget - short
	} else {
		short, long = budget/2, budget/2+budget%2
	}
	if na > nb {
		return long, short
	}
	return short, long
}

// checkVocabSize is CheckVocabSize's rule for both tokenizers.
func checkVocabSize(kind string, have, n int) error {
	if n != have {
		return fmt.Errorf("%w: the %s vocabulary has %d tokens, the model %d", ErrVocabSize, kind, have, n)
	}
	return nil
}

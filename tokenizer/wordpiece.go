package tokenizer

import (
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// WordPieceConfig configures a WordPiece tokenizer. DefaultWordPieceConfig
// returns the values of an uncased BERT checkpoint.
type WordPieceConfig struct {
	// LowerCase lower-cases the text and strips its accents (NFD, then
	// drop the nonspacing marks), as an uncased checkpoint was trained;
	// a cased checkpoint needs false.
	LowerCase bool
	// MaxLen is the length of an Encoding: the special tokens, the
	// text's tokens after truncation and the padding. At least 3, room
	// for [CLS] a [SEP] b [SEP] with empty a and b.
	MaxLen int
	// MaxInputCharsPerWord: a word of more characters (code points)
	// than this is the unknown token as a whole, without looking for
	// its pieces. At least 1.
	MaxInputCharsPerWord int
	// The special tokens, which the vocabulary must hold: the unknown
	// word, the sequence start, the separator and the padding.
	Unk, CLS, SEP, Pad string
}

// DefaultWordPieceConfig returns the configuration of an uncased BERT
// checkpoint (bert-base-uncased) with 512-token encodings: lower-casing,
// 100 characters a word, the tokens [UNK], [CLS], [SEP] and [PAD].
func DefaultWordPieceConfig() WordPieceConfig {
	return WordPieceConfig{
		LowerCase:            true,
		MaxLen:               512,
		MaxInputCharsPerWord: 100,
		Unk:                  "[UNK]",
		CLS:                  "[CLS]",
		SEP:                  "[SEP]",
		Pad:                  "[PAD]",
	}
}

// Validate reports a configuration that cannot encode: a MaxLen under 3,
// a MaxInputCharsPerWord under 1, an empty special token.
func (c WordPieceConfig) Validate() error {
	switch {
	case c.MaxLen < 3:
		return fmt.Errorf("%w: WordPiece MaxLen %d is under 3 ([CLS] a [SEP] b [SEP] needs 3)", ErrConfig, c.MaxLen)
	case c.MaxInputCharsPerWord < 1:
		return fmt.Errorf("%w: WordPiece MaxInputCharsPerWord %d is under 1", ErrConfig, c.MaxInputCharsPerWord)
	case c.Unk == "" || c.CLS == "" || c.SEP == "" || c.Pad == "":
		return fmt.Errorf("%w: WordPiece special tokens must not be empty (Unk %q, CLS %q, SEP %q, Pad %q)", ErrConfig, c.Unk, c.CLS, c.SEP, c.Pad)
	}
	return nil
}

// WordPiece is BERT's tokenizer: basic tokenization (clean the text, split
// on whitespace and punctuation, put each CJK ideograph apart, optionally
// lower-case and strip accents), then each word into the longest
// vocabulary pieces from its start, the pieces after the first prefixed
// with "##"; a word with no such split is the unknown token. It follows
// google-research/bert's tokenization.py (FullTokenizer, commit f18bd94)
// and matches it on every string of the conformance corpus
// (TestWordPieceConformance). It is immutable once built and safe for
// concurrent use.
type WordPiece struct {
	cfg                WordPieceConfig
	vocab              map[string]int32
	size               int
	unk, cls, sep, pad int32
}

// LoadWordPiece reads a BERT vocab.txt (one token a line, its id the line's
// number from 0) and returns its tokenizer.
func LoadWordPiece(vocabPath string, cfg WordPieceConfig) (*WordPiece, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(vocabPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read WordPiece vocabulary: %w", err)
	}
	tokens, err := ParseVocabTxt(data)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, vocabPath)
	}
	w, err := NewWordPiece(tokens, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, vocabPath)
	}
	return w, nil
}

// ParseVocabTxt returns the tokens of a vocab.txt in id order, read as the
// reference's load_vocab reads it: lines end at "\n", "\r\n" or "\r"
// (Python's universal newlines), each token is its line with the
// surrounding whitespace stripped, and a last line without its newline
// still counts. An empty file or one that is not UTF-8 is an error.
func ParseVocabTxt(data []byte) ([]string, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: vocab.txt is empty", ErrVocab)
	}
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: vocab.txt is not valid UTF-8", ErrVocab)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	text = strings.ReplaceAll(text, "\r", "\n")
	text = strings.TrimSuffix(text, "\n")
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimFunc(l, pySpace)
	}
	return lines, nil
}

// NewWordPiece returns the tokenizer of a vocabulary given in id order
// (token i has id i). A token listed twice has the id of its last line,
// as in the reference's dictionary; the vocabulary size is still the
// number of lines. A vocabulary lacking one of cfg's special tokens is an
// error wrapping ErrVocab.
func NewWordPiece(tokens []string, cfg WordPieceConfig) (*WordPiece, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("%w: WordPiece vocabulary is empty", ErrVocab)
	}
	if int64(len(tokens)) > 1<<31-1 {
		return nil, fmt.Errorf("%w: WordPiece vocabulary of %d tokens is over int32", ErrVocab, len(tokens))
	}
	w := &WordPiece{cfg: cfg, vocab: make(map[string]int32, len(tokens)), size: len(tokens)}
	for i, t := range tokens {
		w.vocab[t] = int32(i)
	}
	for _, s := range []struct {
		name string
		id   *int32
	}{{cfg.Unk, &w.unk}, {cfg.CLS, &w.cls}, {cfg.SEP, &w.sep}, {cfg.Pad, &w.pad}} {
		id, ok := w.vocab[s.name]
		if !ok {
			return nil, fmt.Errorf("%w: WordPiece vocabulary lacks the special token %s", ErrVocab, s.name)
		}
		*s.id = id
	}
	return w, nil
}

// Config returns the tokenizer's configuration.
func (w *WordPiece) Config() WordPieceConfig { return w.cfg }

// VocabSize returns the number of tokens of the vocabulary: the ids are
// 0 to VocabSize()-1.
func (w *WordPiece) VocabSize() int { return w.size }

// CheckVocabSize returns an error wrapping ErrVocabSize unless n, a
// model's vocabulary size (its embedding's rows), is VocabSize().
func (w *WordPiece) CheckVocabSize(n int) error { return checkVocabSize("WordPiece", w.size, n) }

// ID returns a token's id and whether the vocabulary has it.
func (w *WordPiece) ID(token string) (int32, bool) {
	id, ok := w.vocab[token]
	return id, ok
}

// SpecialIDs returns the ids of the unknown, start, separator and padding
// tokens.
func (w *WordPiece) SpecialIDs() (unk, cls, sep, pad int32) { return w.unk, w.cls, w.sep, w.pad }

// Tokens returns text's word pieces (FullTokenizer.tokenize).
func (w *WordPiece) Tokens(text string) []string {
	var out []string
	for _, word := range basicTokens(nil, text, w.cfg.LowerCase) {
		out = w.pieces(out, word)
	}
	return out
}

// AppendIDs appends the ids of text's word pieces to dst and returns the
// extended slice: Tokens, each through the vocabulary. No special token
// is added.
func (w *WordPiece) AppendIDs(dst []int32, text string) []int32 {
	var pieces []string
	for _, word := range basicTokens(nil, text, w.cfg.LowerCase) {
		pieces = w.pieces(pieces[:0], word)
		for _, p := range pieces {
			dst = append(dst, w.vocab[p])
		}
	}
	return dst
}

// pieces appends to dst the word pieces of one word of the basic
// tokenization (WordpieceTokenizer.tokenize): from the word's start, the
// longest prefix that is in the vocabulary, then from its end the longest
// piece that is in it with "##" before it, and so on; a word of more than
// MaxInputCharsPerWord characters, or with a remainder that no piece
// starts, is the unknown token.
func (w *WordPiece) pieces(dst []string, word string) []string {
	if utf8.RuneCountInString(word) > w.cfg.MaxInputCharsPerWord {
		return append(dst, w.cfg.Unk)
	}
	n := len(dst)
	for start := 0; start < len(word); {
		end := len(word)
		found := ""
		for end > start {
			sub := word[start:end]
			if start > 0 {
				sub = "##" + sub
			}
			if _, ok := w.vocab[sub]; ok {
				found = sub
				break
			}
			_, size := utf8.DecodeLastRuneInString(word[start:end])
			end -= size
		}
		if found == "" {
			return append(dst[:n], w.cfg.Unk)
		}
		dst = append(dst, found)
		start = end
	}
	return dst
}

// Encode returns text's encoding for a BERT model: [CLS], text's ids,
// [SEP], then [PAD] up to MaxLen. The text's ids are cut from the end to
// fit (MaxLen-2 of them at most). Token types are all 0; the attention
// mask is 1 on the tokens and 0 on the padding.
func (w *WordPiece) Encode(text string) Encoding {
	a := w.AppendIDs(nil, text)
	keep := min(len(a), w.cfg.MaxLen-2)
	b := newBuilder(w.cfg.MaxLen, w.pad)
	b.put(w.cls, 0)
	b.putAll(a[:keep], 0)
	b.put(w.sep, 0)
	b.e.Truncated = len(a) - keep
	return b.e
}

// EncodePair returns the encoding of a pair of texts for a BERT model:
// [CLS] a [SEP] b [SEP], then [PAD] up to MaxLen; token type 0 up to the
// first [SEP], 1 for b and its [SEP], 0 on the padding; the attention
// mask 1 on the tokens. Texts too long for MaxLen-3 tokens are cut from
// their ends, the longer first (LongestFirst).
func (w *WordPiece) EncodePair(a, b string) Encoding {
	ia, ib := w.AppendIDs(nil, a), w.AppendIDs(nil, b)
	na, nb := LongestFirst(len(ia), len(ib), w.cfg.MaxLen-3)
	e := newBuilder(w.cfg.MaxLen, w.pad)
	e.put(w.cls, 0)
	e.putAll(ia[:na], 0)
	e.put(w.sep, 0)
	e.putAll(ib[:nb], 1)
	e.put(w.sep, 1)
	e.e.Truncated = len(ia) - na + len(ib) - nb
	return e.e
}

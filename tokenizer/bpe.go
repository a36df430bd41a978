package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"unicode/utf8"
)

// EndOfText is GPT-2's end-of-text token, which DefaultBPEConfig pads
// with: GPT-2 has no padding token.
const EndOfText = "<|endoftext|>"

// BPEConfig configures a byte-level BPE tokenizer. DefaultBPEConfig
// returns GPT-2's.
type BPEConfig struct {
	// MaxLen is the length of an Encoding: the texts' tokens after
	// truncation, then the padding. At least 1.
	MaxLen int
	// Pad is the token whose id fills the padded positions, which the
	// vocabulary must hold. GPT-2 has no padding token; the usual choice,
	// and the default, is its end-of-text token (Hugging Face's
	// tokenizer.pad_token = tokenizer.eos_token). The attention mask is 0
	// there, so the choice changes no output of the model, only which
	// embedding row the padded positions read.
	Pad string
}

// DefaultBPEConfig returns GPT-2's configuration: 1024-token encodings
// padded with <|endoftext|>.
func DefaultBPEConfig() BPEConfig { return BPEConfig{MaxLen: 1024, Pad: EndOfText} }

// Validate reports a configuration that cannot encode: a MaxLen under 1
// or an empty Pad.
func (c BPEConfig) Validate() error {
	switch {
	case c.MaxLen < 1:
		return fmt.Errorf("%w: BPE MaxLen %d is under 1", ErrConfig, c.MaxLen)
	case c.Pad == "":
		return fmt.Errorf("%w: BPE Pad is empty: name the token that pads (GPT-2 has none; %s is the usual one)", ErrConfig, EndOfText)
	}
	return nil
}

// BPE is GPT-2's byte-level byte-pair encoding. Text is cut into pieces by
// GPT-2's pattern (preTokens); each piece's UTF-8 bytes become one symbol
// each through the bytes_to_unicode table, and adjacent symbols are merged
// pair by pair, the pair of lowest rank in the merges first, until no
// ranked pair is left; each final symbol is a vocabulary token. It follows
// openai/gpt-2's src/encoder.py (Encoder.encode, commit 27a0888) and
// matches it on every string of the conformance corpus
// (TestBPEConformance). Every byte string has an encoding and Decode
// returns the bytes encoded. It is safe for concurrent use.
//
// Bytes that are not valid UTF-8 (which Python's text cannot hold) are
// classified by the pattern as U+FFFD, a symbol, and encoded as the bytes
// they are.
//
// Merging a piece of n bytes scans its symbols once per merge applied, at
// worst O(n²), as the reference's loop does; pieces are words, numbers or
// runs of punctuation or whitespace, short in text.
type BPE struct {
	cfg    BPEConfig
	vocab  map[string]int32
	tokens []string // by id; "" for an id no token has
	byteID [256]int32
	merges map[uint64]merge // by pairKey of the two symbols' ids
	pad    int32

	mu    sync.Mutex
	cache map[string][]int32 // a piece's ids; cleared when full
}

// merge is one line of the merges file: its rank (line order) and the id
// of the merged symbol.
type merge struct{ rank, id int32 }

// bpeCacheSize bounds the per-piece cache (pieces of at most
// bpeCacheKeyLen bytes). The cache changes no result: a piece's ids depend
// on the piece alone.
const (
	bpeCacheSize   = 1 << 14
	bpeCacheKeyLen = 64
)

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// byteSymbols is bytes_to_unicode: the symbol of each byte. The printable
// bytes ('!' to '~', '¡' to '¬', '®' to 'ÿ') are their own code point;
// the other 68 (controls, space, NBSP, soft hyphen) take U+0100 onwards in
// byte order, so that no symbol is whitespace or a control.
var byteSymbols = func() (t [256]rune) {
	n := rune(0)
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			t[b] = rune(b)
		} else {
			t[b] = 256 + n
			n++
		}
	}
	return t
}()

// LoadBPE reads a GPT-2 vocab.json (token to id) and merges.txt (an
// optional "#version" line, then one merge a line: two symbols separated
// by a space, the first line ranked first) and returns their tokenizer.
func LoadBPE(vocabPath, mergesPath string, cfg BPEConfig) (*BPE, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	vdata, err := os.ReadFile(vocabPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read BPE vocabulary: %w", err)
	}
	vocab, err := ParseVocabJSON(vdata)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, vocabPath)
	}
	mdata, err := os.ReadFile(mergesPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read BPE merges: %w", err)
	}
	merges, err := ParseMergesTxt(mdata)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, mergesPath)
	}
	t, err := NewBPE(vocab, merges, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w (%s, %s)", err, vocabPath, mergesPath)
	}
	return t, nil
}

// ParseVocabJSON returns the token-to-id map of a vocab.json: one JSON
// object whose values are integers. An empty file or another JSON value
// is an error.
func ParseVocabJSON(data []byte) (map[string]int32, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, fmt.Errorf("%w: vocab.json is empty", ErrVocab)
	}
	var raw map[string]int64
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%w: vocab.json is not a JSON object of token ids: %v", ErrVocab, err)
	}
	vocab := make(map[string]int32, len(raw))
	for t, id := range raw {
		if id < 0 || id > math.MaxInt32-1 {
			return nil, fmt.Errorf("%w: vocab.json gives %q the id %d, outside [0, 2³¹-1)", ErrVocab, t, id)
		}
		vocab[t] = int32(id)
	}
	return vocab, nil
}

// ParseMergesTxt returns the merges of a merges.txt in rank order. A
// first line starting with "#version" is a header and skipped (the
// reference skips the first line whatever it is, and the line after the
// last newline; here a merge on either is kept, as Hugging Face's
// tokenizers keeps it). Lines end at "\n", "\r\n" or "\r"; blank lines are
// skipped; any other line must be two symbols separated by whitespace. A
// file with no merge is an error.
func ParseMergesTxt(data []byte) ([][2]string, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: merges.txt is not valid UTF-8", ErrMerges)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	text = strings.ReplaceAll(text, "\r", "\n")
	lines := strings.Split(text, "\n")
	var merges [][2]string
	for i, line := range lines {
		if i == 0 && strings.HasPrefix(line, "#version") {
			continue
		}
		f := strings.FieldsFunc(line, pySpace)
		switch len(f) {
		case 0:
			continue
		case 2:
			merges = append(merges, [2]string{f[0], f[1]})
		default:
			return nil, fmt.Errorf("%w: merges.txt line %d has %d fields, want 2: %q", ErrMerges, i+1, len(f), line)
		}
	}
	if len(merges) == 0 {
		return nil, fmt.Errorf("%w: merges.txt has no merge", ErrMerges)
	}
	return merges, nil
}

// NewBPE returns the tokenizer of a vocabulary (token to id) and merges
// in rank order. It returns an error wrapping ErrVocab for an empty
// vocabulary, two tokens with one id, a byte without its symbol, or a
// missing cfg.Pad; wrapping ErrMerges for a merge one of whose symbols,
// or whose merged symbol, the vocabulary lacks. A pair merged twice has
// the rank of its last line, as in the reference's dictionary.
func NewBPE(vocab map[string]int32, merges [][2]string, cfg BPEConfig) (*BPE, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(vocab) == 0 {
		return nil, fmt.Errorf("%w: BPE vocabulary is empty", ErrVocab)
	}
	if len(merges) > math.MaxInt32 {
		return nil, fmt.Errorf("%w: %d merges are over int32", ErrMerges, len(merges))
	}
	t := &BPE{cfg: cfg, vocab: vocab, merges: make(map[uint64]merge, len(merges)), cache: make(map[string][]int32)}
	size := int32(0)
	for _, id := range vocab {
		size = max(size, id+1)
	}
	t.tokens = make([]string, size)
	for tok, id := range vocab {
		if tok == "" {
			return nil, fmt.Errorf("%w: BPE vocabulary has an empty token (id %d)", ErrVocab, id)
		}
		if t.tokens[id] != "" {
			return nil, fmt.Errorf("%w: BPE vocabulary gives two tokens the id %d", ErrVocab, id)
		}
		t.tokens[id] = tok
	}
	for b, r := range byteSymbols {
		id, ok := vocab[string(r)]
		if !ok {
			return nil, fmt.Errorf("%w: BPE vocabulary lacks %q, the symbol of byte 0x%02x", ErrVocab, string(r), b)
		}
		t.byteID[b] = id
	}
	pad, ok := vocab[cfg.Pad]
	if !ok {
		return nil, fmt.Errorf("%w: BPE vocabulary lacks the padding token %s (BPEConfig.Pad)", ErrVocab, cfg.Pad)
	}
	t.pad = pad
	for rank, m := range merges {
		ids := [3]int32{}
		for i, sym := range [3]string{m[0], m[1], m[0] + m[1]} {
			id, ok := vocab[sym]
			if !ok {
				return nil, fmt.Errorf("%w: merge %d (%q %q): the vocabulary lacks %q", ErrMerges, rank+1, m[0], m[1], sym)
			}
			ids[i] = id
		}
		a, b, ab := ids[0], ids[1], ids[2]
		t.merges[pairKey(a, b)] = merge{rank: int32(rank), id: ab}
	}
	return t, nil
}

// Config returns the tokenizer's configuration.
func (t *BPE) Config() BPEConfig { return t.cfg }

// VocabSize returns one more than the largest id: the rows a model's
// embedding needs.
func (t *BPE) VocabSize() int { return len(t.tokens) }

// CheckVocabSize returns an error wrapping ErrVocabSize unless n, a
// model's vocabulary size (its embedding's rows), is VocabSize().
func (t *BPE) CheckVocabSize(n int) error { return checkVocabSize("BPE", len(t.tokens), n) }

// ID returns a token's id and whether the vocabulary has it.
func (t *BPE) ID(token string) (int32, bool) {
	id, ok := t.vocab[token]
	return id, ok
}

// PadID returns the id that pads an Encoding (BPEConfig.Pad's).
func (t *BPE) PadID() int32 { return t.pad }

// Tokens returns the vocabulary tokens of text's encoding, in the
// byte-to-unicode alphabet (a space is "Ġ").
func (t *BPE) Tokens(text string) []string {
	ids := t.AppendIDs(nil, text)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = t.tokens[id]
	}
	return out
}

// AppendIDs appends the ids of text's tokens to dst and returns the
// extended slice (Encoder.encode). No special token is added.
func (t *BPE) AppendIDs(dst []int32, text string) []int32 {
	for i := 0; i < len(text); {
		end := preTokenEnd(text, i)
		dst = t.appendPiece(dst, text[i:end])
		i = end
	}
	return dst
}

// appendPiece appends the ids of one pre-tokenized piece (Encoder.bpe),
// through the cache.
func (t *BPE) appendPiece(dst []int32, piece string) []int32 {
	if len(piece) <= bpeCacheKeyLen {
		t.mu.Lock()
		ids, ok := t.cache[piece]
		t.mu.Unlock()
		if ok {
			return append(dst, ids...)
		}
	}
	n := len(dst)
	dst = t.merge(dst, piece)
	if len(piece) <= bpeCacheKeyLen {
		ids := append([]int32(nil), dst[n:]...)
		t.mu.Lock()
		if len(t.cache) >= bpeCacheSize {
			clear(t.cache)
		}
		t.cache[piece] = ids
		t.mu.Unlock()
	}
	return dst
}

// merge appends the ids of piece's symbols after the merges: start from
// one symbol a byte; while some adjacent pair has a rank, take the pair of
// lowest rank and merge each of its occurrences, left to right (so "aaa"
// with the merge "a a" gives "aa", "a"). Symbols are vocabulary ids: NewBPE
// checked that every byte's symbol and every merge's result is a token,
// and one token has one id, so comparing ids compares the symbols.
func (t *BPE) merge(dst []int32, piece string) []int32 {
	n := len(dst)
	for i := 0; i < len(piece); i++ {
		dst = append(dst, t.byteID[piece[i]])
	}
	syms := dst[n:]
	for len(syms) > 1 {
		best := merge{rank: -1}
		var first, second int32
		for i := 0; i+1 < len(syms); i++ {
			m, ok := t.merges[pairKey(syms[i], syms[i+1])]
			if ok && (best.rank < 0 || m.rank < best.rank) {
				best, first, second = m, syms[i], syms[i+1]
			}
		}
		if best.rank < 0 {
			break
		}
		out := syms[:0]
		for i := 0; i < len(syms); {
			if i+1 < len(syms) && syms[i] == first && syms[i+1] == second {
				out = append(out, best.id)
				i += 2
			} else {
				out = append(out, syms[i])
				i++
			}
		}
		syms = out
	}
	return dst[:n+len(syms)]
}

// Decode appends to dst the bytes that ids encode (Encoder.decode without
// its UTF-8 decoding) and returns the extended slice: Decode of
// AppendIDs(text) is text's bytes. An id no token has, or a token with a
// character outside the byte alphabet, is an error naming its position
// (dst is then returned as it was).
func (t *BPE) Decode(dst []byte, ids []int32) ([]byte, error) {
	n := len(dst)
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.tokens) || t.tokens[id] == "" {
			return dst[:n], fmt.Errorf("tokenizer: id %d at position %d is no BPE token", id, i)
		}
		for _, r := range t.tokens[id] {
			b, ok := symbolByte(r)
			if !ok {
				return dst[:n], fmt.Errorf("tokenizer: BPE token %q (id %d, position %d) is not in the byte alphabet", t.tokens[id], id, i)
			}
			dst = append(dst, b)
		}
	}
	return dst, nil
}

// symbolByte inverts byteSymbols.
func symbolByte(r rune) (byte, bool) {
	if r < 0 || int(r) >= len(symbolBytes) || symbolBytes[r] < 0 {
		return 0, false
	}
	return byte(symbolBytes[r]), true
}

// symbolBytes is the byte of each symbol of byteSymbols, -1 for a code
// point that is no symbol.
var symbolBytes = func() (t [256 + 68]int16) {
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteSymbols {
		t[r] = int16(b)
	}
	return t
}()

// Encode returns text's encoding for a GPT-2 model: its ids, cut from the
// end to MaxLen, then the padding id (PadID) up to MaxLen. No special
// token is added, as GPT-2's tokenizer adds none. Token types are all 0;
// the attention mask is 1 on the tokens and 0 on the padding.
func (t *BPE) Encode(text string) Encoding {
	a := t.AppendIDs(nil, text)
	keep := min(len(a), t.cfg.MaxLen)
	b := newBuilder(t.cfg.MaxLen, t.pad)
	b.putAll(a[:keep], 0)
	b.e.Truncated = len(a) - keep
	return b.e
}

// EncodePair returns the encoding of two texts for a GPT-2 model: a's ids
// then b's, with no token between them (GPT-2's tokenizer adds none), cut
// from their ends to MaxLen the longer first (LongestFirst), then the
// padding; token type 0 for a, 1 for b, 0 on the padding; the attention
// mask 1 on the tokens.
func (t *BPE) EncodePair(a, b string) Encoding {
	ia, ib := t.AppendIDs(nil, a), t.AppendIDs(nil, b)
	na, nb := LongestFirst(len(ia), len(ib), t.cfg.MaxLen)
	e := newBuilder(t.cfg.MaxLen, t.pad)
	e.putAll(ia[:na], 0)
	e.putAll(ib[:nb], 1)
	e.e.Truncated = len(ia) - na + len(ib) - nb
	return e.e
}

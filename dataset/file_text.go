package dataset

import (
	"hash/fnv"
	"io"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dpcluster/dpcluster/tokenizer"
)

// Text defaults: the tokens kept per document and the hashing
// tokenizer's vocabulary when FileOptions leaves them 0.
const (
	DefaultSeqLen    = 128
	DefaultTextVocab = 1 << 14
	// maxTextBytes is how much of a document is read: enough for any
	// sequence length a model takes (tokens past SeqLen are dropped).
	maxTextBytes = 1 << 20
)

// HashTokenizer turns text into token ids without a vocabulary learned
// from the data: a word (a maximal run of Unicode letters and digits,
// lower-cased) is id FNV-1a-32(word) mod Vocab. Being a fixed public
// function, it costs no privacy budget and every node tokenizes the same
// way; distinct words may share an id (the hashing trick). A learned
// vocabulary would reveal the private corpus's words and must not be
// built from it without its own privacy accounting.
type HashTokenizer struct {
	Vocab  int // ids are in [0, Vocab)
	SeqLen int // tokens per example: longer text is cut, shorter padded with -1
}

// Tokenize writes text's first SeqLen token ids into dst[:SeqLen] as
// float32 (exact: ids < 2^24) and pads the rest with -1. It panics if dst
// is shorter than SeqLen (programmer error).
func (t HashTokenizer) Tokenize(text string, dst []float32) {
	dst = dst[:t.SeqLen]
	n := 0
	for i := 0; i < len(text) && n < len(dst); {
		r, size := utf8.DecodeRuneInString(text[i:])
		if !isWordRune(r) {
			i += size
			continue
		}
		j := i
		for j < len(text) {
			r, size := utf8.DecodeRuneInString(text[j:])
			if !isWordRune(r) {
				break
			}
			j += size
		}
		h := fnv.New32a()
		io.WriteString(h, strings.ToLower(text[i:j]))
		dst[n] = float32(h.Sum32() % uint32(t.Vocab))
		n++
		i = j
	}
	for ; n < len(dst); n++ {
		dst[n] = -1
	}
}

// TokenizePair writes the token ids of the pair (a, b) into
// dst[:SeqLen]: a's tokens, then b's, cut to fit SeqLen from their ends,
// the longer first (tokenizer.LongestFirst, Hugging Face's "longest
// first" truncation); the rest is padded with -1. It panics if dst is
// shorter than SeqLen.
func (t HashTokenizer) TokenizePair(a, b string, dst []float32) {
	dst = dst[:t.SeqLen]
	ta := make([]float32, t.SeqLen)
	tb := make([]float32, t.SeqLen)
	t.Tokenize(a, ta)
	t.Tokenize(b, tb)
	na, nb := tokenizer.LongestFirst(tokens(ta), tokens(tb), t.SeqLen)
	n := copy(dst, ta[:na])
	n += copy(dst[n:], tb[:nb])
	for ; n < len(dst); n++ {
		dst[n] = -1
	}
}

// tokens returns the number of ids before the padding (-1) in ids.
func tokens(ids []float32) int {
	for i, v := range ids {
		if v < 0 {
			return i
		}
	}
	return len(ids)
}

func isWordRune(r rune) bool {
	return r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r))
}

// textTokenizer returns the tokenizer FileOptions asks for: SeqLen from
// o.SeqLen or a one-entry o.InputShape, else DefaultSeqLen; the
// checkpoint tokenizer in o.Tokenizer (LoadPretrainedTokenizer), whose
// vocabulary o.Vocab must match if set, or the HashTokenizer of o.Vocab
// (DefaultTextVocab if 0) ids.
func textTokenizer(path string, o FileOptions) (TextTokenizer, error) {
	seqLen := o.SeqLen
	if seqLen == 0 && len(o.InputShape) == 1 {
		seqLen = o.InputShape[0]
	}
	if seqLen == 0 {
		seqLen = DefaultSeqLen
	}
	switch {
	case seqLen < 1 || seqLen > 1<<16:
		return nil, optionsErr(path, "SeqLen %d outside [1, 65536]", seqLen)
	case len(o.InputShape) > 0 && (len(o.InputShape) != 1 || o.InputShape[0] != seqLen):
		return nil, optionsErr(path, "a text dataset's InputShape is [SeqLen] = [%d], not %v", seqLen, o.InputShape)
	}
	if o.Tokenizer != "" {
		t, err := LoadPretrainedTokenizer(o.Tokenizer, seqLen)
		if err != nil {
			return nil, err
		}
		if o.Vocab != 0 && o.Vocab != t.VocabSize() {
			return nil, optionsErr(path, "Vocab %d, but the tokenizer in %s has %d tokens", o.Vocab, o.Tokenizer, t.VocabSize())
		}
		return t, nil
	}
	t := HashTokenizer{Vocab: o.Vocab, SeqLen: seqLen}
	if t.Vocab == 0 {
		t.Vocab = DefaultTextVocab
	}
	if t.Vocab < 1 || t.Vocab > MaxTokenID {
		return nil, optionsErr(path, "Vocab %d outside [1, %d]", t.Vocab, MaxTokenID)
	}
	return t, nil
}

// readTextFolder reads a text folder: DIR/<class>/*.txt, one document
// (example) per file, classes in sorted sub-folder order (or by
// o.Labels), each tokenized by o's tokenizer (textTokenizer) into SeqLen
// ids.
func readTextFolder(dir string, o FileOptions) (*Dataset, error) {
	tok, err := textTokenizer(dir, o)
	if err != nil {
		return nil, err
	}
	classDirs, classes, lab, err := classFolders(dir, o, "*.txt")
	if err != nil {
		return nil, err
	}
	d := &Dataset{Dim: tok.Len(), Shape: []int{tok.Len()}, Vocab: tok.VocabSize()}
	for k, name := range classDirs {
		files, err := classFiles(filepath.Join(dir, name), isTextExt)
		if err != nil {
			return nil, err
		}
		for _, file := range files {
			if len(d.X) > maxReadValues-d.Dim {
				return nil, formatErr(file, nil, "more than %d token values in the folder", maxReadValues)
			}
			f, _, err := openData(file)
			if err != nil {
				return nil, err
			}
			text, err := io.ReadAll(io.LimitReader(f, maxTextBytes))
			f.Close()
			if err != nil {
				return nil, fileOpenErr(file, err)
			}
			n := len(d.X)
			d.X = append(d.X, make([]float32, d.Dim)...)
			tok.Tokenize(string(text), d.X[n:])
			d.Y = append(d.Y, classes[k])
		}
	}
	if d.Len() == 0 {
		return nil, formatErr(dir, nil, "no .txt documents in its class sub-folders %s", quoteList(classDirs, 8))
	}
	if d.Classes, d.LabelNames, err = lab.finish(d.Y); err != nil {
		return nil, formatErr(dir, nil, "%v", err)
	}
	return d, nil
}

func isTextExt(ext string) bool { return ext == ".txt" }

// isTextFolder reports whether the folder dir holds text: its first
// class sub-folder (sorted) has .txt files and no images. Anything else
// is read as images (and ReadFile reads a text folder as images when
// given a [C,H,W] InputShape).
func isTextFolder(dir string) bool {
	subs, err := classFoldersOnly(dir)
	if err != nil || len(subs) == 0 {
		return false
	}
	sub := filepath.Join(dir, subs[0])
	texts, err := classFiles(sub, isTextExt)
	if err != nil || len(texts) == 0 {
		return false
	}
	images, err := imageFiles(sub)
	return err == nil && len(images) == 0
}

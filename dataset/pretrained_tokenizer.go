package dataset

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dpcluster/dpcluster/tokenizer"
)

// A TextTokenizer turns a document, or a pair of documents, into Len()
// token ids in [0, VocabSize()), padded with -1 (no token). It is a
// public function of the text: it costs no privacy budget, and every node
// tokenizes alike. HashTokenizer is one; PretrainedTokenizer, a
// checkpoint's own tokenizer, is the other.
type TextTokenizer interface {
	// Tokenize and TokenizePair write the ids into dst[:Len()]; they
	// panic if dst is shorter (programmer error).
	Tokenize(text string, dst []float32)
	TokenizePair(a, b string, dst []float32)
	Len() int
	VocabSize() int
}

// Len returns SeqLen.
func (t HashTokenizer) Len() int { return t.SeqLen }

// VocabSize returns Vocab.
func (t HashTokenizer) VocabSize() int { return t.Vocab }

// encoder is what PretrainedTokenizer needs of a tokenizer package
// tokenizer.
type encoder interface {
	Encode(text string) tokenizer.Encoding
	EncodePair(a, b string) tokenizer.Encoding
	VocabSize() int
}

// PretrainedTokenizer is a pretrained model's own tokenizer, read from the
// folder a Hugging Face checkpoint is saved in (LoadPretrainedTokenizer):
// BERT's WordPiece (vocab.txt: [CLS] text [SEP], pairs [CLS] a [SEP] b
// [SEP]) or GPT-2's byte-level BPE (vocab.json and merges.txt: the text's
// tokens alone). Padding is -1, as for every text dataset; the token
// types of a pair are not kept (the models that take them read them from
// the positions of the [SEP] ids).
type PretrainedTokenizer struct {
	enc    encoder
	seqLen int
	// Kind is "wordpiece" or "bpe"; Dir the folder it was read from.
	Kind, Dir string
}

// Tokenize writes text's encoding (its ids, -1 on the padding) into dst.
func (t *PretrainedTokenizer) Tokenize(text string, dst []float32) {
	t.put(t.enc.Encode(text), dst[:t.seqLen])
}

// TokenizePair writes the pair's encoding into dst.
func (t *PretrainedTokenizer) TokenizePair(a, b string, dst []float32) {
	t.put(t.enc.EncodePair(a, b), dst[:t.seqLen])
}

func (t *PretrainedTokenizer) put(e tokenizer.Encoding, dst []float32) {
	for i, id := range e.InputIDs {
		dst[i] = float32(id)
		if e.AttentionMask[i] == 0 {
			dst[i] = -1
		}
	}
}

// Len returns the tokens per example.
func (t *PretrainedTokenizer) Len() int { return t.seqLen }

// VocabSize returns the tokenizer's vocabulary size.
func (t *PretrainedTokenizer) VocabSize() int { return t.enc.VocabSize() }

// LoadPretrainedTokenizer reads the tokenizer of the checkpoint folder dir
// for examples of seqLen tokens: WordPiece from vocab.txt (lower-casing
// as tokenizer_config.json's do_lower_case says, true without it, as for
// bert-base-uncased), or byte-level BPE from vocab.json and merges.txt
// (padded with <|endoftext|>'s id, masked out). A folder with neither, a
// vocabulary the tokenizer cannot use, or one larger than MaxTokenID is
// an error wrapping ErrFileOptions or the tokenizer package's errors.
func LoadPretrainedTokenizer(dir string, seqLen int) (*PretrainedTokenizer, error) {
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	}
	t := &PretrainedTokenizer{seqLen: seqLen, Dir: dir}
	var err error
	switch {
	case exists("vocab.txt"):
		cfg := tokenizer.DefaultWordPieceConfig()
		cfg.MaxLen = seqLen
		if cfg.LowerCase, err = doLowerCase(dir); err != nil {
			return nil, err
		}
		t.Kind = "wordpiece"
		t.enc, err = tokenizer.LoadWordPiece(filepath.Join(dir, "vocab.txt"), cfg)
	case exists("vocab.json") && exists("merges.txt"):
		cfg := tokenizer.DefaultBPEConfig()
		cfg.MaxLen = seqLen
		t.Kind = "bpe"
		t.enc, err = tokenizer.LoadBPE(filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt"), cfg)
	case exists("vocab.json"):
		return nil, fmt.Errorf("%w: tokenizer %s: vocab.json without merges.txt (GPT-2's byte-level BPE needs both)", ErrFileOptions, dir)
	default:
		return nil, fmt.Errorf("%w: tokenizer %s: no vocab.txt (WordPiece) or vocab.json and merges.txt (byte-level BPE)", ErrFileOptions, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", dir, err)
	}
	if n := t.enc.VocabSize(); n > MaxTokenID {
		return nil, fmt.Errorf("%w: tokenizer %s: %d tokens, more than %d", ErrFileOptions, dir, n, MaxTokenID)
	}
	return t, nil
}

// doLowerCase reads do_lower_case from dir's tokenizer_config.json: true
// when the file or the key is absent.
func doLowerCase(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	var c struct {
		DoLowerCase *bool `json:"do_lower_case"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return false, fmt.Errorf("%w: tokenizer %s: tokenizer_config.json: %v", ErrFileOptions, dir, err)
	}
	if c.DoLowerCase == nil {
		return true, nil
	}
	return *c.DoLowerCase, nil
}

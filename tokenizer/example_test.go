package tokenizer_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/dpcluster/dpcluster/tokenizer"
)

// A BERT checkpoint's vocab.txt, here a small one, read with the settings
// of an uncased checkpoint and 12-token encodings.
func Example() {
	dir, err := os.MkdirTemp("", "tokenizer-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	vocab := filepath.Join(dir, "vocab.txt")
	lines := "[PAD]\n[UNK]\n[CLS]\n[SEP]\nun\n##want\n##ed\nrunn\n##ing\n,\nhow\nare\nyou\n?\n"
	if err := os.WriteFile(vocab, []byte(lines), 0o600); err != nil {
		fmt.Println(err)
		return
	}
	cfg := tokenizer.DefaultWordPieceConfig()
	cfg.MaxLen = 12
	bert, err := tokenizer.LoadWordPiece(vocab, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := bert.CheckVocabSize(30522); err != nil {
		fmt.Println(err)
	}
	fmt.Println(bert.Tokens("UNwantéd,running"))
	e := bert.EncodePair("How are you?", "Unwanted running")
	fmt.Println(e.InputIDs)
	fmt.Println(e.TokenTypeIDs)
	fmt.Println(e.AttentionMask)
	// Output:
	// tokenizer: vocabulary size mismatch: the WordPiece vocabulary has 14 tokens, the model 30522
	// [un ##want ##ed , runn ##ing]
	// [2 10 11 12 13 3 4 5 6 7 8 3]
	// [0 0 0 0 0 0 1 1 1 1 1 1]
	// [1 1 1 1 1 1 1 1 1 1 1 1]
}

package dataset

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestHashTokenizer: words are runs of letters and digits, lower-cased;
// the same word is the same id wherever it appears; ids are in [0, Vocab);
// text is cut at SeqLen and padded with -1.
func TestHashTokenizer(t *testing.T) {
	tok := HashTokenizer{Vocab: 1000, SeqLen: 6}
	got := make([]float32, 6)
	tok.Tokenize("The cat, the CAT; ünïcode!", got)
	if got[0] != got[2] || got[1] != got[3] || got[0] == got[1] {
		t.Errorf("Tokenize = %v: want the/the and cat/CAT the same ids, the ≠ cat", got)
	}
	if got[5] != -1 || got[4] < 0 || got[4] >= 1000 {
		t.Errorf("Tokenize = %v: want five words then padding", got)
	}
	long := make([]float32, 6)
	tok.Tokenize(strings.Repeat("word ", 50), long)
	if slices.Contains(long, -1) {
		t.Errorf("a long text is padded: %v", long)
	}
	empty := make([]float32, 6)
	tok.Tokenize(" ,;\xff\xfe ", empty)
	for _, v := range empty {
		if v != -1 {
			t.Fatalf("no words, but %v", empty)
		}
	}
}

// TestReadFileTextFolder: a folder of .txt documents per class is one
// example per file, classes by sorted sub-folder name, tokens by the
// hashing tokenizer; it is found by FormatOf and feeds a textbag model.
func TestReadFileTextFolder(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"spam/1.txt": "win money now", "spam/2.txt": "cheap money", "ham/1.txt": "see you at lunch",
		"ham/notes.md": "ignored", "ham/.hidden.txt": "ignored too",
	} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, name, []byte(text))
	}
	if f, err := FormatOf(dir); err != nil || f != FormatTextFolder {
		t.Fatalf("FormatOf = %q, %v; want %q", f, err, FormatTextFolder)
	}
	d, err := ReadFile(dir, FileOptions{SeqLen: 4, Vocab: 97})
	if err != nil {
		t.Fatal(err)
	}
	if d.Len() != 3 || d.Classes != 2 || !slices.Equal(d.LabelNames, []string{"ham", "spam"}) ||
		!slices.Equal(d.Y, []int32{0, 1, 1}) || d.Vocab != 97 || !slices.Equal(d.Shape, []int{4}) {
		t.Fatalf("dataset: %d rows, %d classes %v, Y %v, vocab %d, shape %v", d.Len(), d.Classes, d.LabelNames, d.Y, d.Vocab, d.Shape)
	}
	want := make([]float32, 4)
	HashTokenizer{Vocab: 97, SeqLen: 4}.Tokenize("win money now", want)
	if !slices.Equal(d.Row(1), want) {
		t.Errorf("spam/1.txt: %v, want %v", d.Row(1), want)
	}
	if d.Row(1)[1] != d.Row(2)[1] {
		t.Errorf("\"money\" has two ids: %v and %v", d.Row(1), d.Row(2))
	}
	// InputShape [L] sets the sequence length; anything else is refused.
	if d, err := ReadFile(dir, FileOptions{InputShape: []int{8}}); err != nil || d.Dim != 8 || d.Vocab != DefaultTextVocab {
		t.Errorf("InputShape [8]: %v, %v", d, err)
	}
	if _, err := ReadFile(dir, FileOptions{InputShape: []int{2, 4}}); !errors.Is(err, ErrFileOptions) {
		t.Errorf("InputShape [2 4]: %v, want ErrFileOptions", err)
	}
	if _, err := ReadFile(dir, FileOptions{Vocab: MaxTokenID + 1}); !errors.Is(err, ErrFileOptions) {
		t.Errorf("Vocab too large: %v, want ErrFileOptions", err)
	}
}

// FuzzReadFileText: any bytes in a document give a valid token dataset.
func FuzzReadFileText(f *testing.F) {
	f.Add([]byte("hello world"), 4)
	f.Add([]byte("\xff\xfe\x00 ÄÖÜ 123 𝔘𝔫𝔦"), 1)
	f.Fuzz(func(t *testing.T, data []byte, seqLen int) {
		fuzzReadFile(t, "c/doc.txt", data, true, FileOptions{SeqLen: 1 + int(uint(seqLen)%64), Vocab: 50})
	})
}

package dataset

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReadCSVTextColumn: a CSV file's text column is tokenized into
// SeqLen ids per row by the hashing tokenizer (a text pair: each text's
// tokens in turn, the longer cut first), its label column read like any
// CSV label; a missing text column, a text column that is the label, a
// text column without a header and one in another format are one-line
// errors.
func TestReadCSVTextColumn(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "reviews.csv")
	csv := "id,review,reply,sentiment\n" +
		"1,\"A fine, fine film.\",Agreed entirely,pos\n" +
		"2,Dull and far too long,\"No, it was great\",neg\n" +
		"3,\"Great\",one two three four five six seven,pos\n"
	if err := os.WriteFile(path, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	o := FileOptions{LabelColumn: "sentiment", TextColumn: "review", SeqLen: 6, Vocab: 1 << 20}
	d, err := ReadFile(path, o)
	if err != nil {
		t.Fatal(err)
	}
	tok := HashTokenizer{Vocab: 1 << 20, SeqLen: 6}
	want := make([]float32, 6)
	if d.Dim != 6 || !slices.Equal(d.Shape, []int{6}) || d.Vocab != 1<<20 || d.Len() != 3 || !slices.Equal(d.LabelNames, []string{"neg", "pos"}) {
		t.Fatalf("dataset %d×%d shape %v vocab %d labels %v", d.Len(), d.Dim, d.Shape, d.Vocab, d.LabelNames)
	}
	for i, text := range []string{"A fine, fine film.", "Dull and far too long", "Great"} {
		tok.Tokenize(text, want)
		if !slices.Equal(d.Row(i), want) {
			t.Errorf("row %d: %v, want %v", i, d.Row(i), want)
		}
	}

	o.TextPairColumn = "reply"
	p, err := ReadFile(path, o)
	if err != nil {
		t.Fatal(err)
	}
	pair := func(a, b string) []float32 {
		ta, tb := make([]float32, 6), make([]float32, 6)
		tok.Tokenize(a, ta)
		tok.Tokenize(b, tb)
		return append(ta[:tokens(ta)], tb[:tokens(tb)]...)
	}
	// Row 1: 4 + 2 tokens fit; row 2: 5 + 4, cut to 3 + 3; row 3: 1 + 7,
	// cut to 1 + 5.
	for i, w := range [][]float32{
		pair("A fine, fine film.", "Agreed entirely"),
		append(pair("Dull and far", "")[:3], pair("", "No, it was")...),
		append(pair("Great", ""), pair("", "one two three four five")...),
	} {
		if !slices.Equal(p.Row(i), w) {
			t.Errorf("pair row %d: %v, want %v", i, p.Row(i), w)
		}
	}

	for name, tc := range map[string]struct {
		o    FileOptions
		file string
		want string
	}{
		"missing column":  {FileOptions{LabelColumn: "sentiment", TextColumn: "summary"}, path, `no column "summary"`},
		"label column":    {FileOptions{LabelColumn: "sentiment", TextColumn: "sentiment"}, path, "is the label column"},
		"no header":       {FileOptions{TextColumn: "review"}, path, "needs a CSV header"},
		"pair without a":  {FileOptions{LabelColumn: "sentiment", TextPairColumn: "reply"}, path, "needs TextColumn"},
		"feature columns": {FileOptions{LabelColumn: "sentiment", TextColumn: "review", FeatureColumns: []string{"id"}}, path, "FeatureColumns must not be set"},
		"npy":             {FileOptions{LabelColumn: "sentiment", TextColumn: "review"}, filepath.Join(dir, "x.npy"), "is read from a CSV file"},
	} {
		_, err := ReadFile(tc.file, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want a one-line error saying %q", name, err, tc.want)
		}
		if name == "missing column" && !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v does not wrap ErrFormat", name, err)
		}
	}
}

// TestReadCSVTextColumnPretrainedTokenizer: with a checkpoint folder's
// vocab.txt as Tokenizer, a text column (and a pair) is tokenized by
// BERT's WordPiece: [CLS] text [SEP] (pairs [CLS] a [SEP] b [SEP]), the
// vocabulary's ids, -1 on the padding; the dataset's Vocab is the
// tokenizer's. A folder with no vocabulary, a Vocab that is not the
// tokenizer's, a tokenizer without a text column and one for a file that
// holds no text are one-line errors.
func TestReadCSVTextColumnPretrainedTokenizer(t *testing.T) {
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "bert")
	if err := os.MkdirAll(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	vocab := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "fine", "film", "dull", "and", "long", ",", ".", "great", "##s"}
	if err := os.WriteFile(filepath.Join(ckpt, "vocab.txt"), []byte(strings.Join(vocab, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "reviews.csv")
	if err := os.WriteFile(path, []byte("review,reply,y\n\"A fine, fine Film.\",Greats,1\n\"Dull and LONG, unseen\",great,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := FileOptions{LabelColumn: "y", TextColumn: "review", SeqLen: 8, Tokenizer: ckpt}
	d, err := ReadFile(path, o)
	if err != nil {
		t.Fatal(err)
	}
	id := func(w string) float32 { return float32(slices.Index(vocab, w)) }
	want := [][]float32{
		{id("[CLS]"), id("a"), id("fine"), id(","), id("fine"), id("film"), id("."), id("[SEP]")},
		{id("[CLS]"), id("dull"), id("and"), id("long"), id(","), id("[UNK]"), id("[SEP]"), -1},
	}
	if d.Vocab != len(vocab) || d.Dim != 8 {
		t.Errorf("vocab %d, dim %d; want %d, 8", d.Vocab, d.Dim, len(vocab))
	}
	for i, w := range want {
		if !slices.Equal(d.Row(i), w) {
			t.Errorf("row %d: %v, want %v", i, d.Row(i), w)
		}
	}
	o.TextPairColumn = "reply"
	p, err := ReadFile(path, o)
	if err != nil {
		t.Fatal(err)
	}
	// Row 1 cut longest first to 5 of its texts' tokens: a fine , (3) and
	// great ##s (2).
	for i, w := range [][]float32{
		{id("[CLS]"), id("a"), id("fine"), id(","), id("[SEP]"), id("great"), id("##s"), id("[SEP]")},
		{id("[CLS]"), id("dull"), id("and"), id("long"), id(","), id("[SEP]"), id("great"), id("[SEP]")},
	} {
		if !slices.Equal(p.Row(i), w) {
			t.Errorf("pair row %d: %v, want %v", i, p.Row(i), w)
		}
	}
	for name, tc := range map[string]struct {
		o    FileOptions
		file string
		want string
	}{
		"no vocabulary":  {FileOptions{LabelColumn: "y", TextColumn: "review", Tokenizer: dir}, path, "no vocab.txt"},
		"vocab mismatch": {FileOptions{LabelColumn: "y", TextColumn: "review", Tokenizer: ckpt, Vocab: 30522}, path, "has 14 tokens"},
		"no text column": {FileOptions{LabelColumn: "y", Tokenizer: ckpt}, path, "set TextColumn"},
		"not text":       {FileOptions{Tokenizer: ckpt}, filepath.Join(dir, "x.npz"), "a tokenizer is for text"},
	} {
		_, err := ReadFile(tc.file, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want a one-line error saying %q", name, err, tc.want)
		}
	}
}

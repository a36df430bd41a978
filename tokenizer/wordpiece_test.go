package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testWordPieceVocab is the vocabulary of google-research/bert's
// tokenization_test.py, with [PAD] added.
var testWordPieceVocab = []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", "low", "lowest"}

func newTestWordPiece(t *testing.T, lower bool, maxLen int) *WordPiece {
	t.Helper()
	cfg := DefaultWordPieceConfig()
	cfg.LowerCase, cfg.MaxLen = lower, maxLen
	w, err := NewWordPiece(testWordPieceVocab, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestBasicTokens checks the basic tokenization on the reference's own
// test cases and on the rules' edges.
func TestBasicTokens(t *testing.T) {
	tests := []struct {
		text  string
		lower bool
		want  []string
	}{
		{" \tHeLLo!how  \n Are yoU?  ", true, []string{"hello", "!", "how", "are", "you", "?"}},
		{"H\u00E9llo", true, []string{"hello"}},
		{" \tHeLLo!how  \n Are yoU?  ", false, []string{"HeLLo", "!", "how", "Are", "yoU", "?"}},
		{"ah\u535A\u63A8zz", true, []string{"ah", "\u535A", "\u63A8", "zz"}},
		{"", true, nil},
		{"\x00\ufffd\u200b", true, nil},
		{"a\x00b", true, []string{"ab"}},
		{"a\u00a0b\u3000c\u2028d", false, []string{"a", "b", "c", "d"}},
		{"$5^`", false, []string{"$", "5", "^", "`"}},
		{"don't", false, []string{"don", "'", "t"}},
		{"ΟΔΟΣ ΟΔΟΣ. Σ ΑΣΑ", true, []string{"οδος", "οδος", ".", "σ", "ασα"}},
		{"İ", true, []string{"i"}},
		{"İ", false, []string{"İ"}},
		{"cafe\u0301 CAFÉ", true, []string{"cafe", "cafe"}},
		{"cafe\u0301", false, []string{"cafe\u0301"}},
		{"\xff\xfeab", false, []string{"ab"}},
	}
	for _, tc := range tests {
		if got := basicTokens(nil, tc.text, tc.lower); !slices.Equal(got, tc.want) {
			t.Errorf("basicTokens(%+q, lower=%t) = %+q, want %+q", tc.text, tc.lower, got, tc.want)
		}
	}
}

// TestPyLowerFinalSigma checks the Final_Sigma context of Python's
// str.lower on the word ends it depends on.
func TestPyLowerFinalSigma(t *testing.T) {
	tests := []struct{ in, want string }{
		{"ΟΔΟΣ", "οδος"},
		{"Σ", "σ"},
		{"ΑΣΑ", "ασα"},
		{"ΑΣ'", "ας'"},
		{"ΑΣ'Α", "ασ'α"},
		{"Α'Σ", "α'ς"},
		{"'Σ", "'σ"},
		{"ΑΣ\u0301", "ας\u0301"},
		{"ΑΣ1", "ας1"},
	}
	for _, tc := range tests {
		if got := pyLower(tc.in); got != tc.want {
			t.Errorf("pyLower(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestWordPieceTokens(t *testing.T) {
	w := newTestWordPiece(t, true, 16)
	tests := []struct {
		text string
		want []string
	}{
		{"", nil},
		{"unwanted running", []string{"un", "##want", "##ed", "runn", "##ing"}},
		{"unwantedX running", []string{"[UNK]", "runn", "##ing"}},
		{"UNwant\u00E9d,running", []string{"un", "##want", "##ed", ",", "runn", "##ing"}},
		{"lowest low", []string{"lowest", "low"}},
		{strings.Repeat("want", 25), []string{"want", "##want"}},
	}
	// 100 characters: one piece "want" and 24 "##want".
	tests[len(tests)-1].want = append([]string{"want"}, slices.Repeat([]string{"##want"}, 24)...)
	for _, tc := range tests {
		if got := w.Tokens(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("Tokens(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
	if got := w.Tokens(strings.Repeat("want", 25) + "w"); !slices.Equal(got, []string{"[UNK]"}) {
		t.Errorf("a word of 101 characters: %q, want [UNK]", got)
	}
	if got, want := w.AppendIDs([]int32{99}, "unwanted,"), []int32{99, 8, 5, 6, 11}; !slices.Equal(got, want) {
		t.Errorf("AppendIDs = %v, want %v", got, want)
	}
}

func TestWordPieceEncode(t *testing.T) {
	w := newTestWordPiece(t, true, 8)
	e := w.Encode("unwanted running")
	want := Encoding{
		InputIDs:      []int32{2, 8, 5, 6, 9, 10, 3, 0},
		TokenTypeIDs:  []int32{0, 0, 0, 0, 0, 0, 0, 0},
		AttentionMask: []int32{1, 1, 1, 1, 1, 1, 1, 0},
	}
	checkEncoding(t, "Encode", e, want)
	e = w.Encode("unwanted running low low")
	want = Encoding{
		InputIDs:      []int32{2, 8, 5, 6, 9, 10, 12, 3},
		TokenTypeIDs:  make([]int32, 8),
		AttentionMask: []int32{1, 1, 1, 1, 1, 1, 1, 1},
		Truncated:     1,
	}
	checkEncoding(t, "Encode truncated", e, want)
	// a has 5 tokens, b 2: the budget of 8-3 keeps b whole and 3 of a.
	e = w.EncodePair("unwanted running", "low lowest")
	want = Encoding{
		InputIDs:      []int32{2, 8, 5, 6, 3, 12, 13, 3},
		TokenTypeIDs:  []int32{0, 0, 0, 0, 0, 1, 1, 1},
		AttentionMask: []int32{1, 1, 1, 1, 1, 1, 1, 1},
		Truncated:     2,
	}
	checkEncoding(t, "EncodePair", e, want)
	e = w.EncodePair("", "")
	want = Encoding{
		InputIDs:      []int32{2, 3, 3, 0, 0, 0, 0, 0},
		TokenTypeIDs:  []int32{0, 0, 1, 0, 0, 0, 0, 0},
		AttentionMask: []int32{1, 1, 1, 0, 0, 0, 0, 0},
	}
	checkEncoding(t, "EncodePair of empty texts", e, want)
}

func checkEncoding(t *testing.T, name string, got, want Encoding) {
	t.Helper()
	if !slices.Equal(got.InputIDs, want.InputIDs) || !slices.Equal(got.TokenTypeIDs, want.TokenTypeIDs) ||
		!slices.Equal(got.AttentionMask, want.AttentionMask) || got.Truncated != want.Truncated {
		t.Errorf("%s:\n got  %+v\n want %+v", name, got, want)
	}
}

// TestLongestFirst checks the truncation of a pair against the rule of
// Hugging Face's tokenizers, case by case.
func TestLongestFirst(t *testing.T) {
	tests := []struct{ na, nb, budget, wantA, wantB int }{
		{3, 4, 10, 3, 4},  // fits
		{3, 9, 10, 3, 7},  // only the longer is cut
		{9, 3, 10, 7, 3},  // the same, the other way round
		{8, 9, 10, 5, 5},  // both cut, even budget
		{8, 9, 11, 5, 6},  // odd budget: the longer gets the odd token
		{9, 8, 11, 6, 5},  // the same, the other way round
		{9, 9, 11, 5, 6},  // as long: the second gets it
		{6, 5, 11, 6, 5},  // exactly fits
		{0, 20, 5, 0, 5},  // an empty first
		{20, 0, 5, 5, 0},  // an empty second
		{5, 7, 0, 0, 0},   // no room
		{3, 40, 6, 3, 3},  // shorter kept whole at exactly half
		{4, 40, 7, 3, 4},  // shorter over half: halves
		{12, 30, 1, 0, 1}, // budget of one
	}
	for _, tc := range tests {
		a, b := LongestFirst(tc.na, tc.nb, tc.budget)
		if a != tc.wantA || b != tc.wantB {
			t.Errorf("LongestFirst(%d, %d, %d) = %d, %d, want %d, %d", tc.na, tc.nb, tc.budget, a, b, tc.wantA, tc.wantB)
		}
	}
	for na := range 12 {
		for nb := range 12 {
			for budget := range 25 {
				a, b := LongestFirst(na, nb, budget)
				if a < 0 || b < 0 || a > na || b > nb || a+b != min(na+nb, budget) {
					t.Errorf("LongestFirst(%d, %d, %d) = %d, %d: not a fit of the budget", na, nb, budget, a, b)
				}
			}
		}
	}
}

func TestWordPieceErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := DefaultWordPieceConfig()
	tests := []struct {
		name string
		path string
		cfg  WordPieceConfig
		want error
	}{
		{"missing file", filepath.Join(dir, "none.txt"), cfg, os.ErrNotExist},
		{"empty file", write("empty.txt", ""), cfg, ErrVocab},
		{"not UTF-8", write("latin1.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\ncaf\xe9\n"), cfg, ErrVocab},
		{"no [UNK]", write("nounk.txt", "[PAD]\n[CLS]\n[SEP]\na\n"), cfg, ErrVocab},
		{"no [PAD]", write("nopad.txt", "[UNK]\n[CLS]\n[SEP]\na\n"), cfg, ErrVocab},
		{"no [CLS]", write("nocls.txt", "[PAD]\n[UNK]\n[SEP]\na\n"), cfg, ErrVocab},
		{"no [SEP]", write("nosep.txt", "[PAD]\n[UNK]\n[CLS]\na\n"), cfg, ErrVocab},
		{"MaxLen 2", write("ok.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n"), WordPieceConfig{MaxLen: 2, MaxInputCharsPerWord: 100, Unk: "[UNK]", CLS: "[CLS]", SEP: "[SEP]", Pad: "[PAD]"}, ErrConfig},
		{"zero config", write("ok2.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n"), WordPieceConfig{}, ErrConfig},
	}
	for _, tc := range tests {
		_, err := LoadWordPiece(tc.path, tc.cfg)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: the error is not one line: %q", tc.name, err)
		}
		t.Logf("%s: %v", tc.name, err)
	}
}

// TestParseVocabTxt checks the reading of vocab.txt: line ends, stripped
// tokens, a repeated token (its last line's id), a last line without its
// newline.
func TestParseVocabTxt(t *testing.T) {
	got, err := ParseVocabTxt([]byte("[PAD]\r\n  a  \rb\n\n[UNK]\n[CLS]\n[SEP]\na\nlast"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"[PAD]", "a", "b", "", "[UNK]", "[CLS]", "[SEP]", "a", "last"}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseVocabTxt = %q, want %q", got, want)
	}
	w, err := NewWordPiece(got, DefaultWordPieceConfig())
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := w.ID("a"); id != 7 || w.VocabSize() != 9 {
		t.Errorf("a's id %d, want 7 (its last line); size %d, want 9", id, w.VocabSize())
	}
	if err := w.CheckVocabSize(9); err != nil {
		t.Error(err)
	}
	if err := w.CheckVocabSize(30522); !errors.Is(err, ErrVocabSize) {
		t.Errorf("CheckVocabSize(30522) = %v, want ErrVocabSize", err)
	}
}

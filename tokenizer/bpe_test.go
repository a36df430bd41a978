package tokenizer

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// preTokens returns the pieces preTokenEnd cuts text into.
func preTokens(text string) []string {
	out := []string{}
	for i := 0; i < len(text); {
		end := preTokenEnd(text, i)
		out = append(out, text[i:end])
		i = end
	}
	return out
}

// TestPreTokens checks the hand-written GPT-2 pattern on cases whose
// pieces Python's regex.findall(GPT2Pattern, text) gives (the conformance
// test compares thousands more with Python itself).
func TestPreTokens(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"", []string{}},
		{"Hello world", []string{"Hello", " world"}},
		{"it's", []string{"it", "'s"}},
		{"a   b", []string{"a", "  ", " b"}},
		{"a\n\nb", []string{"a", "\n", "\n", "b"}},
		{"  ", []string{"  "}},
		{" ", []string{" "}},
		{"x  ", []string{"x", "  "}},
		{" 123", []string{" 123"}},
		{"$$$", []string{"$$$"}},
		{" !?", []string{" !?"}},
		{"don't", []string{"don", "'t"}},
		{"DON'T", []string{"DON", "'", "T"}},
		{"''s", []string{"''", "s"}},
		{"x 's", []string{"x", " '", "s"}},
		{"a\u00a0b", []string{"a", "\u00a0", "b"}},
		{"a \u00a0b", []string{"a", " ", "\u00a0", "b"}},
		{"a\t b", []string{"a", "\t", " b"}},
		{"\u3000\u3000x", []string{"\u3000", "\u3000", "x"}},
		{"hello  world  ", []string{"hello", " ", " world", "  "}},
		{"I'm 25 years old!", []string{"I", "'m", " 25", " years", " old", "!"}},
		{"１２ab", []string{"１２", "ab"}},
		{"a\xffb\xfe", []string{"a", "\xffb"[:1], "b", "\xfe"}},
	}
	for _, tc := range tests {
		if got := preTokens(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("preTokens(%+q) = %+q, want %+q", tc.text, got, tc.want)
		}
	}
}

// testBPEVocab returns the 256 byte symbols (ids 0-255 in byte order),
// then extra tokens.
func testBPEVocab(extra ...string) map[string]int32 {
	v := map[string]int32{}
	for _, r := range byteSymbols {
		v[string(r)] = int32(len(v))
	}
	for _, t := range extra {
		v[t] = int32(len(v))
	}
	return v
}

func TestBPEMerges(t *testing.T) {
	cfg := BPEConfig{MaxLen: 6, Pad: EndOfText}
	vocab := testBPEVocab("aa", "bc", "ab", "Ġa", "Ġaa", EndOfText)
	tests := []struct {
		merges [][2]string
		text   string
		want   []string
	}{
		// Every occurrence of the best pair, left to right.
		{[][2]string{{"a", "a"}}, "aaa", []string{"aa", "a"}},
		{[][2]string{{"a", "a"}}, "aaaa", []string{"aa", "aa"}},
		// The lower rank first, wherever it is.
		{[][2]string{{"b", "c"}, {"a", "b"}}, "abc", []string{"a", "bc"}},
		{[][2]string{{"a", "b"}, {"b", "c"}}, "abc", []string{"ab", "c"}},
		// A repeated pair takes its last rank.
		{[][2]string{{"a", "b"}, {"b", "c"}, {"a", "b"}}, "abc", []string{"a", "bc"}},
		// The space's symbol Ġ belongs to the word after it; the ranks
		// decide whether it merges with it.
		{[][2]string{{"Ġ", "a"}, {"a", "a"}, {"Ġa", "a"}}, "x aa", []string{"x", "Ġaa"}},
		{[][2]string{{"a", "a"}, {"Ġ", "a"}, {"Ġa", "a"}}, "x aa", []string{"x", "Ġ", "aa"}},
		{[][2]string{{"a", "a"}}, "", nil},
	}
	for _, tc := range tests {
		b, err := NewBPE(vocab, tc.merges, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Tokens(tc.text); !slices.Equal(got, tc.want) && (len(got) != 0 || len(tc.want) != 0) {
			t.Errorf("merges %q, text %q: %q, want %q", tc.merges, tc.text, got, tc.want)
		}
	}
}

func TestBPEDecodeAndEncode(t *testing.T) {
	b, err := NewBPE(testBPEVocab("aa", EndOfText), [][2]string{{"a", "a"}}, BPEConfig{MaxLen: 6, Pad: EndOfText})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", "aaa b\n\t", "héllo wörld 😀", "a\xffb\xc3", "\x00\x7f\xad\xa0 "} {
		ids := b.AppendIDs(nil, s)
		got, err := b.Decode(nil, ids)
		if err != nil || string(got) != s {
			t.Errorf("Decode(AppendIDs(%+q)) = %+q, %v", s, got, err)
		}
	}
	if _, err := b.Decode(nil, []int32{0, 9999}); err == nil {
		t.Error("Decode of an id outside the vocabulary: no error")
	}
	// testBPEVocab gives each byte's symbol the byte as its id.
	pad, aa, a, sp, x := b.PadID(), int32(256), int32('a'), int32(' '), int32('x')
	if v, _ := b.ID("Ġ"); v != sp {
		t.Fatalf("id of Ġ = %d, want %d", v, sp)
	}
	// No merge joins Ġ and x, so " x" is Ġ, x.
	checkEncoding(t, "Encode", b.Encode("aaa x"), Encoding{
		InputIDs:      []int32{aa, a, sp, x, pad, pad},
		TokenTypeIDs:  make([]int32, 6),
		AttentionMask: []int32{1, 1, 1, 1, 0, 0},
	})
	checkEncoding(t, "Encode truncated", b.Encode("aaaa aaaa x"), Encoding{
		InputIDs:      []int32{aa, aa, sp, aa, aa, sp},
		TokenTypeIDs:  make([]int32, 6),
		AttentionMask: []int32{1, 1, 1, 1, 1, 1},
		Truncated:     1,
	})
	checkEncoding(t, "EncodePair", b.EncodePair("aaa", "x x x x"), Encoding{
		InputIDs:      []int32{aa, a, x, sp, x, sp},
		TokenTypeIDs:  []int32{0, 0, 1, 1, 1, 1},
		AttentionMask: []int32{1, 1, 1, 1, 1, 1},
		Truncated:     3,
	})
	if err := b.CheckVocabSize(258); err != nil {
		t.Error(err)
	}
	if err := b.CheckVocabSize(50257); !errors.Is(err, ErrVocabSize) {
		t.Errorf("CheckVocabSize(50257) = %v, want ErrVocabSize", err)
	}
}

func TestBPEErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	vjson := func(v map[string]int32) string {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	good := testBPEVocab("aa", EndOfText)
	noByte := maps.Clone(good)
	delete(noByte, "Ġ")
	dupID := maps.Clone(good)
	dupID["zz"] = 3
	okVocab := write("ok.json", vjson(good))
	okMerges := write("ok.txt", "#version: 0.2\na a\n")
	cfg := DefaultBPEConfig()
	tests := []struct {
		name          string
		vocab, merges string
		cfg           BPEConfig
		want          error
	}{
		{"missing vocab", filepath.Join(dir, "none.json"), okMerges, cfg, os.ErrNotExist},
		{"missing merges", okVocab, filepath.Join(dir, "none.txt"), cfg, os.ErrNotExist},
		{"empty vocab", write("empty.json", " \n"), okMerges, cfg, ErrVocab},
		{"vocab not an object", write("list.json", `["a"]`), okMerges, cfg, ErrVocab},
		{"negative id", write("neg.json", `{"a": -1}`), okMerges, cfg, ErrVocab},
		{"two tokens one id", write("dup.json", vjson(dupID)), okMerges, cfg, ErrVocab},
		{"byte without symbol", write("nobyte.json", vjson(noByte)), okMerges, cfg, ErrVocab},
		{"no pad", okVocab, okMerges, BPEConfig{MaxLen: 8, Pad: "<pad>"}, ErrVocab},
		{"empty merges", okVocab, write("empty.txt", ""), cfg, ErrMerges},
		{"header only", okVocab, write("header.txt", "#version: 0.2\n"), cfg, ErrMerges},
		{"three fields", okVocab, write("three.txt", "#version: 0.2\na a a\n"), cfg, ErrMerges},
		{"merge of a missing symbol", okVocab, write("missing.txt", "#version: 0.2\na a\naa zz\n"), cfg, ErrMerges},
		{"merge to a missing token", okVocab, write("missing2.txt", "a b\n"), cfg, ErrMerges},
		{"MaxLen 0", okVocab, okMerges, BPEConfig{Pad: EndOfText}, ErrConfig},
	}
	for _, tc := range tests {
		_, err := LoadBPE(tc.vocab, tc.merges, tc.cfg)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: the error is not one line: %q", tc.name, err)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	if _, err := LoadBPE(okVocab, okMerges, cfg); err != nil {
		t.Errorf("good files: %v", err)
	}
}

// TestParseMergesTxt checks the reading of merges.txt: the header, line
// ends, blank lines, a last line without its newline.
func TestParseMergesTxt(t *testing.T) {
	got, err := ParseMergesTxt([]byte("#version: 0.2\r\na b\r\n\nĠ t\rc  d\ne f"))
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"a", "b"}, {"Ġ", "t"}, {"c", "d"}, {"e", "f"}}
	if !slices.Equal(got, want) {
		t.Errorf("ParseMergesTxt = %q, want %q", got, want)
	}
}

// TestBPEConcurrent tokenizes strings from four goroutines at once, which
// share the piece cache, and requires the ids of a tokenizer used alone
// (run it with -race).
func TestBPEConcurrent(t *testing.T) {
	corpus := conformanceCorpus(100)[:len(handCases)+100]
	vocab, merges := trainBPE(corpus, 100)
	cfg := BPEConfig{MaxLen: 8, Pad: EndOfText}
	alone, err := NewBPE(vocab, merges, cfg)
	if err != nil {
		t.Fatal(err)
	}
	shared, err := NewBPE(vocab, merges, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := make([][]int32, len(corpus))
	for i, s := range corpus {
		want[i] = alone.AppendIDs(nil, s)
	}
	var wg sync.WaitGroup
	errs := make([]int, 4)
	for g := range 4 {
		wg.Go(func() {
			for k := range 3 * len(corpus) {
				i := (k*(g+1) + g) % len(corpus)
				if !slices.Equal(shared.AppendIDs(nil, corpus[i]), want[i]) {
					errs[g]++
				}
			}
		})
	}
	wg.Wait()
	for g, n := range errs {
		if n > 0 {
			t.Errorf("goroutine %d: %d strings tokenized otherwise than alone", g, n)
		}
	}
}

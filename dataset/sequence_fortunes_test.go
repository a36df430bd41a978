package dataset

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseFortunes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"one\n", []string{"one"}},
		{"one\ntwo lines\n%\nthree\n", []string{"one\ntwo lines", "three"}},
		{"%\n\n  \n%\nlast", []string{"last"}},                      // white-space fortunes are dropped
		{"a\n\n%\n b\n % \t\nc\r\n%", []string{"a\n", " b", "c\r"}}, // "%" with spaces separates; \r is kept
		{"_\bu_\bn_\bd_\be_\br\n%\nx\bX", []string{"under", "X"}},   // overstrike: the struck character is dropped
		{"\bstart\n%\né\bE", []string{"start", "E"}},                // a backspace deletes a whole UTF-8 sequence
		{"100%\n%%\n%", []string{"100%\n%%"}},                       // only a lone "%" separates
	} {
		var got []string
		for _, d := range ParseFortunes([]byte(tc.in)) {
			got = append(got, string(d))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("ParseFortunes(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzParseFortunes checks that any bytes parse without panic into
// fortunes that are not white space and hold no backspace, and that
// writing them back as a fortune file parses to the same fortunes.
func FuzzParseFortunes(f *testing.F) {
	f.Add([]byte("a\n%\nb\bc\n\n%\n"))
	f.Add([]byte("\r\n%\r\n\xff\b"))
	f.Fuzz(func(t *testing.T, data []byte) {
		docs := ParseFortunes(data)
		for _, d := range docs {
			if len(bytes.TrimSpace(d)) == 0 || bytes.IndexByte(d, '\b') >= 0 {
				t.Fatalf("fortune %q is white space or holds a backspace", d)
			}
		}
		var file []byte
		for _, d := range docs {
			file = append(append(file, d...), "\n%\n"...)
		}
		again := ParseFortunes(file)
		if !slices.EqualFunc(docs, again, bytes.Equal) {
			t.Fatalf("re-parsing %q gave %q", docs, again)
		}
	})
}

// writeFortunes writes a fortune directory: two category files of n
// fortunes each, plus a .dat file and a .u8 link that must be skipped.
func writeFortunes(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	for _, cat := range []string{"beta", "alpha"} {
		var b strings.Builder
		for i := range n {
			b.WriteString(cat + " fortune " + strings.Repeat("x", i%13) + string(rune('A'+i%26)) + "\n" + cat + string(rune('0'+i%10)) + "\n%\n")
		}
		if err := os.WriteFile(filepath.Join(dir, cat), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "alpha.dat"), []byte("binary\x00index\n%\nnot a fortune\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("alpha", filepath.Join(dir, "alpha.u8")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// docTexts decodes a next-token dataset's windows back into its
// documents' texts.
func docTexts(t *testing.T, d *Dataset) []string {
	t.Helper()
	var ids []int32
	for i := range d.Len() {
		for j, v := range d.Row(i) {
			if v != PadToken && (j > 0 || v == TokenBOS) {
				ids = append(ids, int32(v))
			}
		}
	}
	var out []string
	for _, doc := range splitAtBOS(ids) {
		text, err := ByteTokenizer{}.Decode(nil, doc)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(text))
	}
	return out
}

func TestLoadRunFortunesSeq(t *testing.T) {
	ctx := context.Background()
	dir := writeFortunes(t, 50)
	m := shaper{dim: 9, classes: 1}
	tr, ev, err := LoadRun(ctx, RunOptions{Dataset: NameFortunesSeq, Dir: dir, Model: m})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Dim != 9 || tr.Vocab != ByteVocab || ev.Data == nil || ev.Holdout || ev.Data.Dim != 9 || tr.Name != "fortunes-train" {
		t.Fatalf("train %q Dim %d Vocab %d; eval %+v", tr.Name, tr.Dim, tr.Vocab, ev)
	}
	trainDocs, evalDocs := docTexts(t, tr), docTexts(t, ev.Data)
	if len(trainDocs) != 80 || len(evalDocs) != 10 {
		t.Fatalf("%d training and %d validation fortunes, want 80 and 10 of 100", len(trainDocs), len(evalDocs))
	}
	for _, d := range evalDocs {
		if slices.Contains(trainDocs, d) {
			t.Fatalf("validation fortune %q is also trained on", d)
		}
		if strings.Contains(d, "binary") {
			t.Fatal("the .dat file was read as fortunes")
		}
	}
	tr2, _, err := LoadRun(ctx, RunOptions{Dataset: NameFortunesSeq, Dir: dir, Model: m})
	if err != nil || tr2.ContentHash() != tr.ContentHash() {
		t.Fatalf("a second load trains on other windows (%v)", err)
	}
	// The model's classes label the data (every label is 0).
	tr3, _, err := LoadRun(ctx, RunOptions{Dataset: NameFortunesSeq, Dir: dir, Model: shaper{dim: 9, classes: 4}})
	if err != nil || tr3.Classes != 4 {
		t.Fatalf("with a 4-class model: %v", err)
	}

	for _, tc := range []struct {
		name string
		o    RunOptions
		want error
		msg  string
	}{
		{"a data path", RunOptions{Dataset: NameFortunesSeq, Path: "x.tokens"}, ErrRunOptions, "takes no data_path"},
		{"an eval path", RunOptions{Dataset: NameFortunesSeq, Dir: dir, EvalPath: "x.tokens"}, ErrRunOptions, "for dataset file"},
		{"a model taking one token", RunOptions{Dataset: NameFortunesSeq, Dir: dir, Model: shaper{dim: 1, classes: 1}}, ErrRunOptions, "token windows"},
		{"no fortunes", RunOptions{Dataset: NameFortunesSeq, Dir: t.TempDir()}, ErrSequence, "no fortunes"},
		{"no directory", RunOptions{Dataset: NameFortunesSeq, Dir: filepath.Join(dir, "none")}, os.ErrNotExist, "install the Debian package fortunes"},
	} {
		_, _, err := LoadRun(ctx, tc.o)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want %v mentioning %q", tc.name, err, tc.want, tc.msg)
		}
	}
}

// TestFortunesPackage reads the real Debian fortunes (CI installs the
// package; scripts/lib/setup.sh TEST_PACKAGES): every fortune survives the
// tokenizer, the split is 80/10/10 of the documents, and the splits
// written as token files read back the same.
func TestFortunesPackage(t *testing.T) {
	if _, err := os.Stat(filepath.Join(FortunesDir, "fortunes")); err != nil {
		t.Skipf("the Debian package fortunes is not installed (%v): `apt-get install fortunes` (CI does)", err)
	}
	docs, err := ReadFortunes(FortunesDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 10000 {
		t.Fatalf("%d fortunes in %s, expected more than 10000 (fortunes 1:1.99.1 has 15,2xx)", len(docs), FortunesDir)
	}
	var tok ByteTokenizer
	bytesTotal := 0
	for _, d := range docs {
		bytesTotal += len(d)
		if got, err := tok.Decode(nil, tok.Encode(nil, d)); err != nil || !bytes.Equal(got, d) {
			t.Fatalf("fortune %q does not round-trip", d)
		}
	}
	c := DefaultSequenceConfig()
	sc, err := NewSequenceCorpus("fortunes", docs, c)
	if err != nil {
		t.Fatal(err)
	}
	n := float64(len(docs))
	for _, s := range []struct {
		idx  []int
		frac float64
	}{{sc.TrainDocs, 0.8}, {sc.ValidationDocs, 0.1}, {sc.TestDocs, 0.1}} {
		if math.Abs(float64(len(s.idx))-s.frac*n) > 1 {
			t.Fatalf("a split holds %d of %d documents, want %v of them", len(s.idx), len(docs), s.frac)
		}
	}
	t.Logf("%d fortunes, %d bytes; T=%d: %d/%d/%d windows (train/validation/test)",
		len(docs), bytesTotal, c.Context, sc.Train.Len(), sc.Validation.Len(), sc.Test.Len())
	dir := t.TempDir()
	sf, err := WriteSequenceCorpus(dir, "fortunes", docs, c, 2)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(sf.Train, FileOptions{})
	if err != nil || got.ContentHash() != sc.Train.ContentHash() {
		t.Fatalf("the training file reads back different (%v)", err)
	}
	if sf.ShardRows[0]+sf.ShardRows[1] != sf.TrainRows {
		t.Fatalf("shards hold %v rows, the training split %d", sf.ShardRows, sf.TrainRows)
	}
}

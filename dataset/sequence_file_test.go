package dataset

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// rawTokens returns the bytes of a token file with the given header and
// ids, its checksum correct.
func rawTokens(vocab, width uint32, rows uint64, ids []int32) []byte {
	b := []byte(tokensMagic)
	b = binary.LittleEndian.AppendUint32(b, vocab)
	b = binary.LittleEndian.AppendUint32(b, width)
	b = binary.LittleEndian.AppendUint64(b, rows)
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTokensFileRoundTrip(t *testing.T) {
	c := DefaultSequenceConfig()
	c.Context = 8
	sc, err := NewSequenceCorpus("toy", testCorpus(40), c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "toy-train.tokens")
	if err := WriteTokensFile(path, sc.Train); err != nil {
		t.Fatal(err)
	}
	if f, err := FormatOf(path); err != nil || f != FormatTokens {
		t.Fatalf("FormatOf = %q, %v; want %q", f, err, FormatTokens)
	}
	got, err := ReadFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := sc.Train
	if got.Name != "toy-train" || got.Dim != want.Dim || !slices.Equal(got.Shape, want.Shape) ||
		got.Vocab != want.Vocab || got.Classes != 1 || !slices.Equal(got.X, want.X) || !slices.Equal(got.Y, want.Y) {
		t.Fatalf("read back %q Dim %d Shape %v Vocab %d Classes %d, %d rows; want Dim %d Shape %v Vocab %d, %d rows, same ids",
			got.Name, got.Dim, got.Shape, got.Vocab, got.Classes, got.Len(), want.Dim, want.Shape, want.Vocab, want.Len())
	}
	if got.ContentHash() != want.ContentHash() {
		t.Fatal("the read-back dataset hashes differently")
	}
	// Options that agree with the file are accepted; Classes is honoured.
	got, err = ReadFile(path, FileOptions{Vocab: ByteVocab, SeqLen: 9, InputShape: []int{9}, Classes: 3})
	if err != nil || got.Classes != 3 {
		t.Fatalf("ReadFile with matching options: Classes %v, err %v", got, err)
	}
	// No temporary file is left behind.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("the directory holds %d entries, want only the token file", len(ents))
	}
}

func TestWriteTokensFileRefuses(t *testing.T) {
	dir := t.TempDir()
	num := &Dataset{Name: "num", X: []float32{1, 2}, Y: []int32{0}, Dim: 2, Classes: 1}
	labelled := &Dataset{Name: "lab", X: []float32{1, 2}, Y: []int32{1}, Dim: 2, Classes: 2, Vocab: 4}
	bad := &Dataset{Name: "bad", X: []float32{1, 7}, Y: []int32{0}, Dim: 2, Classes: 1, Vocab: 4}
	for _, d := range []*Dataset{num, labelled, bad} {
		if err := WriteTokensFile(filepath.Join(dir, d.Name+".tokens"), d); err == nil {
			t.Errorf("%s: WriteTokensFile succeeded", d.Name)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("refused writes left %d files", len(ents))
	}
}

func TestReadTokensFileErrors(t *testing.T) {
	good := rawTokens(10, 3, 2, []int32{1, 2, -1, 9, 0, 3})
	damaged := slices.Clone(good)
	damaged[24] ^= 1 // the first id, 1, becomes 0: still in range
	for _, tc := range []struct {
		name string
		data []byte
		o    FileOptions
		kind error
		msg  string
	}{
		{"empty", nil, FileOptions{}, ErrFormat, "shorter than the 24-byte header"},
		{"magic", append([]byte("DPCTOKS2"), good[8:]...), FileOptions{}, ErrFormat, "not a token file"},
		{"id too large", rawTokens(10, 3, 2, []int32{1, 2, 3, 4, 10, 5}), FileOptions{}, ErrFormat, "row 1, position 1: token id 10 outside [-1, 10)"},
		{"id below -1", rawTokens(10, 3, 1, []int32{1, -2, 3}), FileOptions{}, ErrFormat, "row 0, position 1: token id -2"},
		{"vocab 0", rawTokens(0, 3, 1, []int32{1, 2, 3}), FileOptions{}, ErrFormat, "vocabulary 0"},
		{"vocab huge", rawTokens(MaxTokenID+1, 3, 1, []int32{1, 2, 3}), FileOptions{}, ErrFormat, "vocabulary"},
		{"width 0", rawTokens(10, 0, 1, nil), FileOptions{}, ErrFormat, "ids per row"},
		{"no rows", rawTokens(10, 3, 0, nil), FileOptions{}, ErrFormat, "no rows"},
		{"rows overflow", rawTokens(10, 1<<20, 1<<60, nil), FileOptions{}, ErrFormat, "more than"},
		{"truncated", good[:len(good)-5], FileOptions{}, ErrFormat, "truncated or damaged"},
		{"long", append(slices.Clone(good), 0), FileOptions{}, ErrFormat, "truncated or damaged"},
		{"checksum", damaged, FileOptions{}, ErrFormat, "damaged"},
		{"vocab mismatch", good, FileOptions{Vocab: 258}, ErrFormat, "vocabulary 10, but the options say 258"},
		{"seqlen mismatch", good, FileOptions{SeqLen: 4}, ErrFormat, "3 tokens per row"},
		{"shape mismatch", good, FileOptions{InputShape: []int{5}}, ErrFormat, "InputShape"},
		{"labels", good, FileOptions{Labels: []string{"a"}}, ErrFileOptions, "no Labels"},
		{"label column", good, FileOptions{LabelColumn: "y"}, ErrFileOptions, "CSV and Parquet"},
	} {
		path := writeTemp(t, "x.tokens", tc.data)
		_, err := ReadFile(path, tc.o)
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err = %v; want %v naming the file and %q", tc.name, err, tc.kind, tc.msg)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error is not one line: %q", tc.name, err)
		}
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing.tokens"), FileOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want fs.ErrNotExist", err)
	}
}

// FuzzReadTokens checks that arbitrary bytes never panic the token file
// decoder, that every error wraps ErrFormat, and that whatever it accepts
// is a valid token dataset that encodes back to the same bytes (the
// format has one encoding per dataset).
func FuzzReadTokens(f *testing.F) {
	f.Add(rawTokens(10, 3, 2, []int32{1, 2, -1, 9, 0, 3}))
	f.Add(rawTokens(258, 1, 1, []int32{257}))
	f.Add(rawTokens(10, 2, 1, []int32{11, 0}))
	f.Add([]byte(tokensMagic))
	defer func(v int) { maxReadValues = v }(maxReadValues)
	maxReadValues = 1 << 16
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decodeTokens(bytes.NewReader(data), int64(len(data)), "f.tokens")
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("decoded dataset is invalid: %v", err)
		}
		var buf bytes.Buffer
		if err := encodeTokens(&buf, d); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), data) {
			t.Fatal("the decoded dataset encodes to other bytes")
		}
	})
}

func TestWriteSequenceCorpusShards(t *testing.T) {
	dir := t.TempDir()
	docs := testCorpus(80)
	c := DefaultSequenceConfig()
	c.Context = 6
	sf, err := WriteSequenceCorpus(dir, "toy", docs, c, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "toy-train-shard-2-of-3.tokens"); len(sf.TrainShards) != 3 || sf.TrainShards[1] != want {
		t.Fatalf("shards %v, want 3 with the second %s", sf.TrainShards, want)
	}
	read := func(path string) *Dataset {
		t.Helper()
		d, err := ReadFile(path, FileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	train := read(sf.Train)
	if train.Len() != sf.TrainRows || read(sf.Validation).Len() != sf.ValidationRows || read(sf.Test).Len() != sf.TestRows {
		t.Fatal("a split file's rows differ from SequenceFiles'")
	}
	// The shards partition the training windows, and each document's
	// windows sit in one shard: a document's text is decoded whole from
	// exactly one shard.
	var tok ByteTokenizer
	var all [][]float32
	docShard := map[string]int{}
	total := 0
	for s, path := range sf.TrainShards {
		d := read(path)
		// A node of a run whose nodes bring their own data reads its
		// shard against the run's schema (as cli's readLocal does).
		run := Schema{Shape: []int{7}, Classes: 1, Vocab: ByteVocab}
		if err := run.Check(d); err != nil {
			t.Fatalf("shard %d does not have the run's schema: %v", s, err)
		}
		if d.Len() != sf.ShardRows[s] {
			t.Fatalf("shard %d: %d rows, SequenceFiles says %d", s, d.Len(), sf.ShardRows[s])
		}
		total += d.Len()
		var ids []int32
		for i := range d.Len() {
			row := d.Row(i)
			all = append(all, slices.Clone(row))
			for j, v := range row {
				if v != PadToken && (j > 0 || v == TokenBOS) {
					ids = append(ids, int32(v))
				}
			}
		}
		for _, doc := range splitAtBOS(ids) {
			text, err := tok.Decode(nil, doc)
			if err != nil {
				t.Fatal(err)
			}
			if prev, dup := docShard[string(text)]; dup {
				t.Fatalf("document %q in shards %d and %d", text, prev, s)
			}
			docShard[string(text)] = s
		}
	}
	if total != sf.TrainRows {
		t.Fatalf("the shards hold %d rows, the training file %d", total, sf.TrainRows)
	}
	cmpRows := func(a, b []float32) int { return slices.Compare(a, b) }
	var trainRows [][]float32
	for i := range train.Len() {
		trainRows = append(trainRows, train.Row(i))
	}
	slices.SortFunc(all, cmpRows)
	slices.SortFunc(trainRows, cmpRows)
	if !slices.EqualFunc(all, trainRows, slices.Equal) {
		t.Fatal("the shards' rows are not the training file's rows")
	}
	if _, err := WriteSequenceCorpus(dir, "../x", docs, c, 1); !errors.Is(err, ErrSequence) {
		t.Fatalf("a name with a path: err = %v", err)
	}
	if _, err := WriteSequenceCorpus(dir, "toy", docs, c, 1000); !errors.Is(err, ErrSequence) {
		t.Fatalf("more shards than documents: err = %v", err)
	}
}

// splitAtBOS cuts a token stream into documents, each starting at BOS.
func splitAtBOS(ids []int32) [][]int32 {
	var out [][]int32
	for i, id := range ids {
		if id == TokenBOS {
			out = append(out, nil)
		}
		if len(out) > 0 {
			out[len(out)-1] = append(out[len(out)-1], ids[i])
		}
	}
	return out
}

// BenchmarkReadTokens measures reading a token file of 40000 windows of
// 65 ids (the fortunes training split at T = 64 is 37762 windows).
func BenchmarkReadTokens(b *testing.B) {
	const rows, width = 40000, 65
	ids := make([]int32, rows*width)
	for i := range ids {
		ids[i] = int32(i % ByteVocab)
	}
	path := filepath.Join(b.TempDir(), "bench.tokens")
	if err := os.WriteFile(path, rawTokens(ByteVocab, width, rows, ids), 0o600); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(4 * len(ids)))
	for b.Loop() {
		if _, err := ReadFile(path, FileOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewSequenceCorpus measures tokenizing, splitting and windowing
// 15000 documents of 170 bytes (the fortunes' count and mean length) at
// T = 64.
func BenchmarkNewSequenceCorpus(b *testing.B) {
	docs := make([][]byte, 15000)
	for i := range docs {
		docs[i] = bytes.Repeat([]byte{'a' + byte(i%26)}, 170)
	}
	b.SetBytes(15000 * 170)
	for b.Loop() {
		if _, err := NewSequenceCorpus("bench", docs, DefaultSequenceConfig()); err != nil {
			b.Fatal(err)
		}
	}
}

package dataset

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

func TestByteTokenizerRoundTrip(t *testing.T) {
	var tok ByteTokenizer
	for _, doc := range [][]byte{
		nil,
		[]byte("a"),
		[]byte("Hello, world!\n"),
		[]byte("naïve — ünïcödé"),
		{0, 255, 0xc3, 0x28, '\b', 0x80}, // invalid UTF-8 and control bytes
	} {
		ids := tok.Encode(nil, doc)
		if len(ids) != len(doc)+2 || ids[0] != TokenBOS || ids[len(ids)-1] != TokenEOS {
			t.Fatalf("Encode(%q) = %v: want BOS, %d bytes, EOS", doc, ids, len(doc))
		}
		for i, b := range doc {
			if ids[i+1] != int32(b) {
				t.Fatalf("Encode(%q)[%d] = %d, want byte %d", doc, i+1, ids[i+1], b)
			}
		}
		padded := append(ids, PadToken, PadToken)
		got, err := tok.Decode([]byte("prefix"), padded)
		if err != nil {
			t.Fatalf("Decode(%v): %v", padded, err)
		}
		if want := append([]byte("prefix"), doc...); !bytes.Equal(got, want) {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q", doc, got, want)
		}
	}
	if tok.Vocab() != ByteVocab || ByteVocab != TokenEOS+1 {
		t.Fatalf("Vocab() = %d, ByteVocab = %d, EOS = %d", tok.Vocab(), ByteVocab, TokenEOS)
	}
}

func TestByteTokenizerDecodeRejectsOutOfRange(t *testing.T) {
	var tok ByteTokenizer
	for _, id := range []int32{-2, ByteVocab, 1 << 20} {
		got, err := tok.Decode([]byte("x"), []int32{'a', id})
		if !errors.Is(err, ErrSequence) {
			t.Fatalf("Decode with id %d: err = %v, want ErrSequence", id, err)
		}
		if string(got) != "x" {
			t.Fatalf("Decode with id %d returned %q, want dst unchanged", id, got)
		}
	}
}

// FuzzByteTokenizer checks the round trip on arbitrary bytes and that
// Decode never panics on arbitrary ids.
func FuzzByteTokenizer(f *testing.F) {
	f.Add([]byte("hello"))
	f.Add([]byte{0, 1, 2, 0xff, 0xfe})
	f.Fuzz(func(t *testing.T, doc []byte) {
		var tok ByteTokenizer
		got, err := tok.Decode(nil, tok.Encode(nil, doc))
		if err != nil || !bytes.Equal(got, doc) {
			t.Fatalf("Decode(Encode(%q)) = %q, %v", doc, got, err)
		}
		ids := make([]int32, len(doc)/2)
		for i := range ids {
			ids[i] = int32(int16(uint16(doc[2*i]) | uint16(doc[2*i+1])<<8))
		}
		if _, err := tok.Decode(nil, ids); err != nil && !errors.Is(err, ErrSequence) {
			t.Fatalf("Decode error %v does not wrap ErrSequence", err)
		}
	})
}

func TestAppendWindows(t *testing.T) {
	p := float32(PadToken)
	for _, tc := range []struct {
		ids  []int32
		T    int
		want [][]float32
	}{
		{ids: []int32{1}, T: 3, want: nil}, // one id: no target
		{ids: []int32{1, 2}, T: 3, want: [][]float32{{1, 2, p, p}}},
		{ids: []int32{1, 2, 3, 4}, T: 3, want: [][]float32{{1, 2, 3, 4}}},
		{ids: []int32{1, 2, 3, 4, 5}, T: 3, want: [][]float32{{1, 2, 3, 4}, {4, 5, p, p}}},
		{ids: []int32{1, 2, 3, 4, 5, 6, 7}, T: 3, want: [][]float32{{1, 2, 3, 4}, {4, 5, 6, 7}}},
		{ids: []int32{1, 2, 3}, T: 1, want: [][]float32{{1, 2}, {2, 3}}},
	} {
		got := AppendWindows([]float32{9}, tc.ids, tc.T)
		want := []float32{9}
		for _, w := range tc.want {
			want = append(want, w...)
		}
		if !slices.Equal(got, want) {
			t.Errorf("AppendWindows(%v, T=%d) = %v, want %v", tc.ids, tc.T, got[1:], want[1:])
		}
		if n := windowCount(len(tc.ids), tc.T); n != len(tc.want) {
			t.Errorf("windowCount(%d, %d) = %d, want %d", len(tc.ids), tc.T, n, len(tc.want))
		}
	}
}

// TestWindowsPredictEveryTokenOnce checks the windows' contract on many
// lengths: each id after the first is a target (a non-padding id at a
// position t+1 ≥ 1) in exactly one window, with its true predecessor.
func TestWindowsPredictEveryTokenOnce(t *testing.T) {
	for T := 1; T <= 6; T++ {
		for n := 0; n <= 20; n++ {
			ids := make([]int32, n)
			for i := range ids {
				ids[i] = int32(i)
			}
			x := AppendWindows(nil, ids, T)
			if len(x)%(T+1) != 0 {
				t.Fatalf("T=%d n=%d: %d values, not whole windows", T, n, len(x))
			}
			seen := make([]int, n)
			for w := 0; w < len(x); w += T + 1 {
				win := x[w : w+T+1]
				for j := 1; j <= T; j++ {
					if win[j] == PadToken {
						for _, v := range win[j:] {
							if v != PadToken {
								t.Fatalf("T=%d n=%d: padding inside window %v", T, n, win)
							}
						}
						break
					}
					if win[j] != win[j-1]+1 {
						t.Fatalf("T=%d n=%d: window %v is not consecutive ids", T, n, win)
					}
					seen[int(win[j])]++
				}
			}
			for i := 1; i < n; i++ {
				if seen[i] != 1 {
					t.Fatalf("T=%d n=%d: id %d is a target %d times, want 1", T, n, i, seen[i])
				}
			}
		}
	}
}

func TestSplitDocuments(t *testing.T) {
	c := DefaultSequenceConfig()
	tr, va, te, err := SplitDocuments(1000, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != 800 || len(va) != 100 || len(te) != 100 {
		t.Fatalf("split sizes %d/%d/%d, want 800/100/100", len(tr), len(va), len(te))
	}
	all := slices.Concat(tr, va, te)
	slices.Sort(all)
	for i, v := range all {
		if v != i {
			t.Fatalf("the splits are not a partition of [0, 1000): position %d holds %d", i, v)
		}
	}
	for _, s := range [][]int{tr, va, te} {
		if !slices.IsSorted(s) {
			t.Fatal("a split's indices are not increasing")
		}
	}
	tr2, va2, te2, _ := SplitDocuments(1000, c)
	if !slices.Equal(tr, tr2) || !slices.Equal(va, va2) || !slices.Equal(te, te2) {
		t.Fatal("the same seed gave a different split")
	}
	c.Seed++
	tr3, _, _, _ := SplitDocuments(1000, c)
	if slices.Equal(tr, tr3) {
		t.Fatal("another seed gave the same training split")
	}
	c.Seed--
	c.TrainFraction, c.ValidationFraction = 0.5, 0.2
	tr, va, te, _ = SplitDocuments(10, c)
	if len(tr) != 5 || len(va) != 2 || len(te) != 3 {
		t.Fatalf("10 documents at 0.5/0.2: sizes %d/%d/%d, want 5/2/3", len(tr), len(va), len(te))
	}
}

func TestSequenceConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*SequenceConfig)
		n    int
	}{
		{"T=0", func(c *SequenceConfig) { c.Context = 0 }, 100},
		{"T<0", func(c *SequenceConfig) { c.Context = -3 }, 100},
		{"T too long", func(c *SequenceConfig) { c.Context = MaxContext + 1 }, 100},
		{"no test share", func(c *SequenceConfig) { c.TrainFraction, c.ValidationFraction = 0.9, 0.1 }, 100},
		{"zero validation", func(c *SequenceConfig) { c.ValidationFraction = 0 }, 100},
		{"NaN", func(c *SequenceConfig) { c.TrainFraction = math.NaN() }, 100},
		{"too few documents", func(c *SequenceConfig) {}, 4},
		{"no documents", func(c *SequenceConfig) {}, 0},
	} {
		c := DefaultSequenceConfig()
		tc.edit(&c)
		if _, _, _, err := SplitDocuments(tc.n, c); !errors.Is(err, ErrSequence) {
			t.Errorf("%s: SplitDocuments err = %v, want ErrSequence", tc.name, err)
		}
	}
}

// testCorpus returns n small documents whose text names their index, so
// a window tells which document it came from.
func testCorpus(n int) [][]byte {
	docs := make([][]byte, n)
	for i := range docs {
		docs[i] = fmt.Appendf(nil, "<%d>%s", i, bytes.Repeat([]byte{'a' + byte(i%26)}, i%17))
	}
	return docs
}

func TestNewSequenceCorpusSplitsByDocument(t *testing.T) {
	docs := testCorpus(60)
	docs = append(docs, nil, []byte{}) // empty documents are dropped
	c := DefaultSequenceConfig()
	c.Context = 4
	sc, err := NewSequenceCorpus("toy", docs, c)
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, s := range []struct {
		d    *Dataset
		idx  []int
		name string
	}{{sc.Train, sc.TrainDocs, "train"}, {sc.Validation, sc.ValidationDocs, "validation"}, {sc.Test, sc.TestDocs, "test"}} {
		if err := s.d.Validate(); err != nil {
			t.Fatal(err)
		}
		if s.d.Dim != 5 || !slices.Equal(s.d.Shape, []int{5}) || s.d.Vocab != ByteVocab || s.d.Classes != 1 || s.d.Name != "toy-"+s.name {
			t.Fatalf("%s: Dim %d Shape %v Vocab %d Classes %d Name %q", s.name, s.d.Dim, s.d.Shape, s.d.Vocab, s.d.Classes, s.d.Name)
		}
		for _, y := range s.d.Y {
			if y != 0 {
				t.Fatalf("%s: label %d, want 0", s.name, y)
			}
		}
		// Rebuild the split's token stream from its windows (dropping
		// each window's first id, which the previous window ended with)
		// and check it is its documents' encodings, in order.
		var stream []int32
		var tok ByteTokenizer
		for i := range s.d.Len() {
			row := s.d.Row(i)
			for j, v := range row {
				if v == PadToken || (j == 0 && v != TokenBOS) {
					continue
				}
				stream = append(stream, int32(v))
			}
		}
		var want []int32
		for _, i := range s.idx {
			want = tok.Encode(want, docs[i])
			owner[string(docs[i])] += s.name
		}
		if !slices.Equal(stream, want) {
			t.Fatalf("%s: the windows' tokens are not the split's documents", s.name)
		}
	}
	if len(owner) != 60 {
		t.Fatalf("%d documents in the splits, want 60", len(owner))
	}
	for doc, o := range owner {
		if o != "train" && o != "validation" && o != "test" {
			t.Fatalf("document %q is in %q", doc, o)
		}
	}
}

func TestNewSequenceCorpusErrors(t *testing.T) {
	c := DefaultSequenceConfig()
	for name, docs := range map[string][][]byte{"nil": nil, "empty documents": {nil, {}}, "too few": testCorpus(3)} {
		if _, err := NewSequenceCorpus("x", docs, c); !errors.Is(err, ErrSequence) {
			t.Errorf("%s: err = %v, want ErrSequence", name, err)
		}
	}
	c.Context = 0
	if _, err := NewSequenceCorpus("x", testCorpus(50), c); !errors.Is(err, ErrSequence) {
		t.Errorf("T=0: err = %v, want ErrSequence", err)
	}
	if _, err := SequenceDataset("x", testCorpus(5), []int{5}, 4); !errors.Is(err, ErrSequence) {
		t.Errorf("index out of range: err = %v, want ErrSequence", err)
	}
}

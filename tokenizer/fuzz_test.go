package tokenizer

import (
	"bytes"
	"slices"
	"sync"
	"testing"
)

// fuzzSeeds are the targets' seed corpus: the hand-written conformance
// cases and a few strings that are not valid UTF-8.
func fuzzSeeds(f *testing.F) {
	for _, s := range handCases {
		f.Add(s)
	}
	for _, s := range []string{"\xff", "a\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80 x", "'\xff's"} {
		f.Add(s)
	}
}

// fuzzTokenizers builds, once, a WordPiece and a BPE tokenizer from
// vocabularies built from the conformance corpus's hand-written cases and
// some random strings.
var fuzzTokenizers = sync.OnceValues(func() (*WordPiece, *BPE) {
	corpus := conformanceCorpus(200)[:len(handCases)+200]
	cfg := DefaultWordPieceConfig()
	cfg.MaxLen = 64
	w, err := NewWordPiece(buildWordPieceVocab(corpus), cfg)
	if err != nil {
		panic(err)
	}
	vocab, merges := trainBPE(corpus, 200)
	b, err := NewBPE(vocab, merges, BPEConfig{MaxLen: 64, Pad: EndOfText})
	if err != nil {
		panic(err)
	}
	return w, b
})

// checkEncodingShape checks that an Encoding has MaxLen positions, ids in
// [0, size), a mask of ones then zeros, the padding id under the zeros.
func checkEncodingShape(t *testing.T, e Encoding, maxLen, size int, pad int32) {
	t.Helper()
	if len(e.InputIDs) != maxLen || len(e.TokenTypeIDs) != maxLen || len(e.AttentionMask) != maxLen {
		t.Fatalf("encoding lengths %d, %d, %d, want %d", len(e.InputIDs), len(e.TokenTypeIDs), len(e.AttentionMask), maxLen)
	}
	n := e.Len()
	for i, id := range e.InputIDs {
		if id < 0 || int(id) >= size {
			t.Fatalf("id %d at %d outside [0, %d)", id, i, size)
		}
		if want := int32(0); i < n {
			want = 1
			if e.AttentionMask[i] != want {
				t.Fatalf("mask %v is not ones then zeros", e.AttentionMask)
			}
		} else if e.AttentionMask[i] != want || id != pad || e.TokenTypeIDs[i] != 0 {
			t.Fatalf("padding position %d: id %d, mask %d, type %d", i, id, e.AttentionMask[i], e.TokenTypeIDs[i])
		}
	}
}

// FuzzWordPiece: any string tokenizes without panic to ids in range, the
// same ids each time, and encodes to MaxLen positions.
func FuzzWordPiece(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, s string) {
		w, _ := fuzzTokenizers()
		ids := w.AppendIDs(nil, s)
		for _, id := range ids {
			if id < 0 || int(id) >= w.VocabSize() {
				t.Fatalf("id %d outside [0, %d)", id, w.VocabSize())
			}
		}
		if again := w.AppendIDs(nil, s); !slices.Equal(ids, again) {
			t.Fatalf("two runs differ: %v, %v", ids, again)
		}
		if toks := w.Tokens(s); len(toks) != len(ids) {
			t.Fatalf("%d tokens, %d ids", len(toks), len(ids))
		}
		_, _, _, pad := w.SpecialIDs()
		e := w.Encode(s)
		checkEncodingShape(t, e, w.Config().MaxLen, w.VocabSize(), pad)
		if e.Len()-2+e.Truncated != len(ids) {
			t.Fatalf("Encode kept %d and dropped %d of %d ids", e.Len()-2, e.Truncated, len(ids))
		}
		checkEncodingShape(t, w.EncodePair(s, s+s), w.Config().MaxLen, w.VocabSize(), pad)
	})
}

// FuzzBPE: any byte string tokenizes without panic to ids in range, the
// same ids each time (through the cache and around it), decodes back to
// itself, and encodes to MaxLen positions.
func FuzzBPE(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, s string) {
		_, b := fuzzTokenizers()
		ids := b.AppendIDs(nil, s)
		for _, id := range ids {
			if id < 0 || int(id) >= b.VocabSize() {
				t.Fatalf("id %d outside [0, %d)", id, b.VocabSize())
			}
		}
		if again := b.AppendIDs(nil, s); !slices.Equal(ids, again) {
			t.Fatalf("two runs differ: %v, %v", ids, again)
		}
		var direct []int32
		for _, p := range preTokens(s) {
			direct = b.merge(direct, p)
		}
		if !slices.Equal(ids, direct) {
			t.Fatalf("with the cache %v, without %v", ids, direct)
		}
		got, err := b.Decode(nil, ids)
		if err != nil || !bytes.Equal(got, []byte(s)) {
			t.Fatalf("Decode = %+q, %v; want %+q", got, err, s)
		}
		e := b.Encode(s)
		checkEncodingShape(t, e, b.Config().MaxLen, b.VocabSize(), b.PadID())
		if e.Len()+e.Truncated != len(ids) {
			t.Fatalf("Encode kept %d and dropped %d of %d ids", e.Len(), e.Truncated, len(ids))
		}
		checkEncodingShape(t, b.EncodePair(s+s, s), b.Config().MaxLen, b.VocabSize(), b.PadID())
	})
}

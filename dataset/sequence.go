package dataset

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Byte-level tokens: ids 0..255 are the bytes of the text, BOS and EOS
// mark a document's start and end. Padding is -1 (PadToken), which is not
// a token: it is never predicted and never read as context.
const (
	TokenBOS  = 256
	TokenEOS  = 257
	ByteVocab = 258 // the ByteTokenizer's vocabulary size
	PadToken  = -1
)

// Sequence defaults (DefaultSequenceConfig): a context of 64 tokens and an
// 80/10/10 split of the documents.
const (
	DefaultContext            = 64
	DefaultTrainFraction      = 0.8
	DefaultValidationFraction = 0.1
	// DefaultSequenceSeed seeds the document split. It is public: the
	// split depends on the number of documents and this seed, never on
	// their content.
	DefaultSequenceSeed = 1
	// MaxContext bounds SequenceConfig.Context (window length Context+1).
	MaxContext = 1<<16 - 1
)

// ErrSequence is returned (wrapped, with details) for a SequenceConfig
// that describes no split and for a corpus that yields no sequences (no
// non-empty document, a split left without documents).
var ErrSequence = errors.New("dataset: invalid token sequences")

// ByteTokenizer turns text into byte-level token ids: a document is BOS,
// its bytes (each byte b is id b), then EOS; the vocabulary is ByteVocab.
// It is a fixed public function, learned from nothing, so it costs no
// privacy and every node tokenizes the same way; it is exact (any bytes,
// valid UTF-8 or not, decode back unchanged) and has no collisions, which
// a next-token task needs and the HashTokenizer's hashed words lack.
type ByteTokenizer struct{}

// Vocab returns ByteVocab.
func (ByteTokenizer) Vocab() int { return ByteVocab }

// Encode appends doc's token ids to dst (BOS, the bytes, EOS) and returns
// the extended slice.
func (ByteTokenizer) Encode(dst []int32, doc []byte) []int32 {
	dst = slices.Grow(dst, len(doc)+2)
	dst = append(dst, TokenBOS)
	for _, b := range doc {
		dst = append(dst, int32(b))
	}
	return append(dst, TokenEOS)
}

// Decode appends to dst the bytes of ids' byte tokens and returns the
// extended slice: BOS, EOS and padding are dropped, so Decode(Encode(doc))
// is doc. An id outside [-1, ByteVocab) is an error naming its position
// (dst is then returned as it was).
func (ByteTokenizer) Decode(dst []byte, ids []int32) ([]byte, error) {
	n := len(dst)
	for i, id := range ids {
		switch {
		case id >= 0 && id < 256:
			dst = append(dst, byte(id))
		case id == TokenBOS || id == TokenEOS || id == PadToken:
		default:
			return dst[:n], fmt.Errorf("%w: token %d at position %d outside [-1, %d)", ErrSequence, id, i, ByteVocab)
		}
	}
	return dst, nil
}

// SequenceConfig says how documents become next-token examples.
type SequenceConfig struct {
	// Context is T, the tokens a window predicts from: a window holds
	// T+1 ids, and the model predicts id t+1 from ids 0..t for t < T.
	Context int
	// TrainFraction and ValidationFraction are the shares of documents
	// in the training and validation splits; the test split has the rest.
	// All three must be positive.
	TrainFraction, ValidationFraction float64
	// Seed seeds the shuffle of the documents before the split (public).
	Seed uint64
}

// DefaultSequenceConfig returns a context of DefaultContext tokens, an
// 80/10/10 split and DefaultSequenceSeed.
func DefaultSequenceConfig() SequenceConfig {
	return SequenceConfig{
		Context:            DefaultContext,
		TrainFraction:      DefaultTrainFraction,
		ValidationFraction: DefaultValidationFraction,
		Seed:               DefaultSequenceSeed,
	}
}

// Validate checks that 1 ≤ Context ≤ MaxContext and that both fractions
// are in (0, 1) with a positive remainder for the test split.
func (c SequenceConfig) Validate() error {
	if c.Context < 1 || c.Context > MaxContext {
		return fmt.Errorf("%w: context T = %d outside [1, %d]", ErrSequence, c.Context, MaxContext)
	}
	ft, fv := c.TrainFraction, c.ValidationFraction
	if !(ft > 0 && ft < 1) || !(fv > 0 && fv < 1) || !(ft+fv < 1) {
		return fmt.Errorf("%w: train fraction %v and validation fraction %v must be in (0, 1) and leave a positive test fraction", ErrSequence, ft, fv)
	}
	return nil
}

// AppendWindows appends to dst the next-token windows of one document's
// ids and returns the extended slice. Windows hold T+1 ids and start every
// T ids (window k is ids[kT : kT+T+1]), so consecutive windows share one
// id: every id but the first is a prediction target in exactly one
// window. The last window is padded with PadToken; a window that would
// hold a single id (no target) is not made. It panics if T < 1
// (programmer error; SequenceConfig.Validate checks it).
func AppendWindows(dst []float32, ids []int32, T int) []float32 {
	if T < 1 {
		panic(fmt.Sprintf("dataset: AppendWindows: T = %d < 1", T))
	}
	for start := 0; start+1 < len(ids); start += T {
		end := min(start+T+1, len(ids))
		for _, id := range ids[start:end] {
			dst = append(dst, float32(id))
		}
		for range start + T + 1 - end {
			dst = append(dst, PadToken)
		}
	}
	return dst
}

// windowCount returns the number of windows AppendWindows makes of n ids.
func windowCount(n, T int) int {
	if n < 2 {
		return 0
	}
	return (n - 1 + T - 1) / T
}

// SplitDocuments assigns n documents to the training, validation and
// test splits: a permutation of [0, n) drawn from c.Seed, cut into
// round(TrainFraction·n) training documents, round(ValidationFraction·n)
// validation documents and the rest for testing. Indices within a split
// are increasing. It depends only on n and c (never on the documents'
// content), is deterministic, and fails if a split would be empty.
func SplitDocuments(n int, c SequenceConfig) (train, validation, test []int, err error) {
	if err := c.Validate(); err != nil {
		return nil, nil, nil, err
	}
	nt := int(math.Round(c.TrainFraction * float64(n)))
	nv := int(math.Round(c.ValidationFraction * float64(n)))
	if nt < 1 || nv < 1 || n-nt-nv < 1 {
		return nil, nil, nil, fmt.Errorf("%w: %d documents split %v/%v/%v leave a split empty (train %d, validation %d, test %d)",
			ErrSequence, n, c.TrainFraction, c.ValidationFraction, 1-c.TrainFraction-c.ValidationFraction, nt, nv, n-nt-nv)
	}
	perm := newRand(c.Seed).Perm(n)
	train, validation, test = perm[:nt:nt], perm[nt:nt+nv:nt+nv], perm[nt+nv:]
	slices.Sort(train)
	slices.Sort(validation)
	slices.Sort(test)
	return train, validation, test, nil
}

// SequenceDataset tokenizes the documents docs[idx[0]], docs[idx[1]], …
// (in that order) with the ByteTokenizer and cuts each into windows of
// T+1 ids (AppendWindows); a window never holds ids of two documents.
// The result follows the next-token contract: Shape [T+1], Vocab
// ByteVocab, ids as exact float32 integers with PadToken as padding, every
// label 0, Classes 1. An empty document makes no window. It fails if T is
// out of range, an index is out of range, no window results, or the
// windows would hold more than 2^28 values.
func SequenceDataset(name string, docs [][]byte, idx []int, T int) (*Dataset, error) {
	if T < 1 || T > MaxContext {
		return nil, fmt.Errorf("%w: context T = %d outside [1, %d]", ErrSequence, T, MaxContext)
	}
	var tok ByteTokenizer
	rows := 0
	for _, i := range idx {
		if i < 0 || i >= len(docs) {
			return nil, fmt.Errorf("%w: document index %d outside [0, %d)", ErrSequence, i, len(docs))
		}
		if len(docs[i]) > 0 {
			rows += windowCount(len(docs[i])+2, T)
		}
		if rows > maxReadValues/(T+1) {
			return nil, fmt.Errorf("%w: %s: more than %d token values", ErrSequence, name, maxReadValues)
		}
	}
	if rows == 0 {
		return nil, fmt.Errorf("%w: %s: no non-empty document among %d", ErrSequence, name, len(idx))
	}
	d := &Dataset{
		Name: name, X: make([]float32, 0, rows*(T+1)), Y: make([]int32, rows),
		Dim: T + 1, Shape: []int{T + 1}, Classes: 1, Vocab: ByteVocab,
	}
	var ids []int32
	for _, i := range idx {
		if len(docs[i]) == 0 {
			continue
		}
		ids = tok.Encode(ids[:0], docs[i])
		d.X = AppendWindows(d.X, ids, T)
	}
	return d, nil
}

// SequenceCorpus is a corpus cut into next-token datasets, split by
// document: no document has windows in two splits, so no validation or
// test text is trained on.
//
// The unit of privacy is the example, a window, not the document: DP-SGD's
// (ε, δ) holds for each window, and a document cut into k windows has
// only the group guarantee for k examples. The Debian fortunes at T = 64
// give 3.1 windows per fortune on average (median 2, 99th percentile 17,
// longest 39). Per-document privacy would need the windows of a document
// sampled and clipped together, which nothing here does.
type SequenceCorpus struct {
	Train, Validation, Test *Dataset
	// TrainDocs, ValidationDocs and TestDocs are the indices (into the
	// non-empty documents, in corpus order) each split holds.
	TrainDocs, ValidationDocs, TestDocs []int
}

// NewSequenceCorpus drops the empty documents of docs, splits the rest by
// document (SplitDocuments) and builds each split's windows
// (SequenceDataset), named name+"-train", "-validation", "-test". Nothing
// is learned from the documents: the tokenizer is fixed and the split
// depends only on their number and c.Seed. docs is not retained.
func NewSequenceCorpus(name string, docs [][]byte, c SequenceConfig) (*SequenceCorpus, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	docs = nonEmpty(docs)
	if len(docs) == 0 {
		return nil, fmt.Errorf("%w: %s: the corpus has no non-empty document", ErrSequence, name)
	}
	tr, va, te, err := SplitDocuments(len(docs), c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	sc := &SequenceCorpus{TrainDocs: tr, ValidationDocs: va, TestDocs: te}
	if sc.Train, err = SequenceDataset(name+"-train", docs, tr, c.Context); err != nil {
		return nil, err
	}
	if sc.Validation, err = SequenceDataset(name+"-validation", docs, va, c.Context); err != nil {
		return nil, err
	}
	if sc.Test, err = SequenceDataset(name+"-test", docs, te, c.Context); err != nil {
		return nil, err
	}
	return sc, nil
}

// nonEmpty returns the documents of docs that hold at least one byte, in
// order.
func nonEmpty(docs [][]byte) [][]byte {
	out := make([][]byte, 0, len(docs))
	for _, d := range docs {
		if len(d) > 0 {
			out = append(out, d)
		}
	}
	return out
}

// Package dataset holds dpcluster's in-memory labelled datasets and the code
// that produces them: ReadFile for the files users hold (CSV with or
// without a header, NPY/NPZ, Parquet, folders of images per class; every
// reader fuzzed, every bad row a one-line error), the Schema a run of
// nodes with their own data must share, the IDX reader (MNIST /
// Fashion-MNIST format) with Fashion-MNIST discovery, seeded synthetic
// generators (a Gaussian mixture and a Zipf-distributed many-class task), a
// token-sequence builder, next-token windows of text (a byte-level
// tokenizer, a split by document, token files, the Debian fortunes as
// dataset fortunes-seq: sequence.go), train/test splitting and sharding
// across nodes.
//
// A Dataset is a plain struct: X holds Len()*Dim float32 values row-major and
// Y holds Len() labels in [0, Classes). Image datasets use Shape [C,H,W] with
// pixel values scaled to [0,1]; token datasets use Shape [L] and store token
// ids as exact integers in float32 with -1 as padding.
//
// LoadFashionMNIST finds Fashion-MNIST in an explicit directory,
// $DPCLUSTER_DATA, the user cache dir or the Debian package's directory
// /usr/share/datasets/fashion-mnist (`apt-get install dataset-fashion-mnist`),
// and downloads it with SHA-256 verification only when asked to.
//
// Typical use on a node:
//
//	train, test, err := dataset.LoadFashionMNIST(ctx, dataset.DefaultLoadOptions())
//	if err != nil { ... }
//	shards, err := dataset.ShardIID(train, k, seed)
//	mine := shards[nodeIndex]
//
// Nothing in this package is safe for concurrent mutation; concurrent reads of
// a Dataset that nobody writes are fine.
package dataset

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
)

// Dataset is an in-memory labelled dataset, one example per row.
type Dataset struct {
	Name string
	// X holds Len()*Dim values, row-major. Token datasets store token ids as
	// exact integers in float32 (ids < 2^24), with -1 as padding.
	X []float32
	// Y holds Len() labels in [0, Classes).
	Y []int32
	// Dim is the number of features per example.
	Dim int
	// Shape is the per-example shape, whose product equals Dim (e.g. [1,28,28]
	// for images, [L] for tokens); nil means [Dim].
	Shape []int
	// Classes is the number of label classes.
	Classes int
	// Vocab is the vocabulary size for token datasets (0 otherwise).
	Vocab int
	// LabelNames are the class names in class order when the labels came
	// from names (an image folder's sub-folders, a string label column,
	// FileOptions.Labels); nil for integer labels. When set, it has Classes
	// distinct, non-empty entries. It is not part of ContentHash; see
	// LabelSetHash.
	LabelNames []string
	// FeatureNames are the names of the features in feature order when
	// they came from named columns (a CSV file with a header, a Parquet
	// file; not for a text column); nil otherwise. When set, it has Dim
	// entries. It is not part of ContentHash.
	FeatureNames []string
	// Unlabeled says the file had no label column (FileOptions.
	// LabelOptional): every label is 0 and means nothing.
	Unlabeled bool
}

// MaxTokenID is the largest vocabulary size a token dataset may use: ids must
// be exactly representable in float32, so Vocab ≤ 2^24.
const MaxTokenID = 1 << 24

// ErrInvalid is returned (wrapped, with details) by Validate and by
// constructors when a dataset breaks one of the Dataset invariants.
var ErrInvalid = errors.New("dataset: invalid dataset")

// Len returns the number of examples, len(d.Y).
func (d *Dataset) Len() int { return len(d.Y) }

// Row returns example i's features as a slice aliasing d.X: writes through it
// modify the dataset. It panics if i is out of range (programmer error).
func (d *Dataset) Row(i int) []float32 {
	return d.X[i*d.Dim : (i+1)*d.Dim : (i+1)*d.Dim]
}

// Subset returns a new Dataset holding copies of the rows idx, in the order
// given (duplicates allowed). Metadata (Name, Dim, Shape, Classes, Vocab,
// LabelNames) is copied. It panics if an index is out of range (programmer
// error).
func (d *Dataset) Subset(idx []int) *Dataset {
	out := d.emptyLike(len(idx))
	d.Gather(out.X, out.Y, idx)
	return out
}

// emptyLike returns a dataset with d's metadata and room for n rows.
func (d *Dataset) emptyLike(n int) *Dataset {
	var shape []int
	if d.Shape != nil {
		shape = append([]int(nil), d.Shape...)
	}
	var names []string
	if d.LabelNames != nil {
		names = append([]string(nil), d.LabelNames...)
	}
	return &Dataset{
		Name:       d.Name,
		X:          make([]float32, n*d.Dim),
		Y:          make([]int32, n),
		Dim:        d.Dim,
		Shape:      shape,
		Classes:    d.Classes,
		Vocab:      d.Vocab,
		LabelNames: names,
		// FeatureNames is never written through: sharing it is safe.
		FeatureNames: d.FeatureNames,
		Unlabeled:    d.Unlabeled,
	}
}

// Gather copies rows idx into the caller's buffers: row idx[j] goes to
// dstX[j*Dim:(j+1)*Dim] and its label to dstY[j]. It does not allocate.
// dstY may be nil when labels are not wanted. It panics if
// len(dstX) < len(idx)*Dim, if dstY is non-nil and shorter than idx, or if an
// index is out of range (programmer errors).
func (d *Dataset) Gather(dstX []float32, dstY []int32, idx []int) {
	if len(dstX) < len(idx)*d.Dim {
		panic(fmt.Sprintf("dataset: Gather: dstX has %d values, need %d", len(dstX), len(idx)*d.Dim))
	}
	if dstY != nil && len(dstY) < len(idx) {
		panic(fmt.Sprintf("dataset: Gather: dstY has %d values, need %d", len(dstY), len(idx)))
	}
	for j, i := range idx {
		copy(dstX[j*d.Dim:(j+1)*d.Dim], d.X[i*d.Dim:(i+1)*d.Dim])
		if dstY != nil {
			dstY[j] = d.Y[i]
		}
	}
}

// Validate checks the Dataset invariants: Dim ≥ 1, len(X) == Len()*Dim,
// Shape (if set) has positive entries whose product is Dim, Classes ≥ 1,
// LabelNames (if set) has Classes distinct non-empty entries, FeatureNames
// (if set) has Dim entries, every label
// in [0, Classes), and every feature finite. For token datasets (Vocab > 0)
// it also requires Vocab ≤ MaxTokenID and every value to be an
// integer in [-1, Vocab), with -1 meaning padding. Errors wrap ErrInvalid and
// name the first offending row.
func (d *Dataset) Validate() error {
	if d == nil {
		return fmt.Errorf("%w: nil", ErrInvalid)
	}
	if d.Dim < 1 {
		return fmt.Errorf("%w: Dim %d < 1", ErrInvalid, d.Dim)
	}
	if d.Classes < 1 {
		return fmt.Errorf("%w: Classes %d < 1", ErrInvalid, d.Classes)
	}
	if d.Vocab < 0 || d.Vocab > MaxTokenID {
		return fmt.Errorf("%w: Vocab %d outside [0, %d]", ErrInvalid, d.Vocab, MaxTokenID)
	}
	if len(d.X) != len(d.Y)*d.Dim {
		return fmt.Errorf("%w: len(X) = %d, want Len()*Dim = %d*%d", ErrInvalid, len(d.X), len(d.Y), d.Dim)
	}
	if d.Shape != nil {
		prod := 1
		for _, s := range d.Shape {
			if s < 1 {
				return fmt.Errorf("%w: Shape %v has a non-positive entry", ErrInvalid, d.Shape)
			}
			if prod > d.Dim/s { // prod*s > Dim, checked without overflow
				return fmt.Errorf("%w: Shape %v product exceeds Dim %d", ErrInvalid, d.Shape, d.Dim)
			}
			prod *= s
		}
		if prod != d.Dim {
			return fmt.Errorf("%w: Shape %v has product %d, want Dim %d", ErrInvalid, d.Shape, prod, d.Dim)
		}
	}
	if d.LabelNames != nil {
		if len(d.LabelNames) != d.Classes {
			return fmt.Errorf("%w: %d label names for %d classes", ErrInvalid, len(d.LabelNames), d.Classes)
		}
		seen := make(map[string]int, len(d.LabelNames))
		for i, name := range d.LabelNames {
			if name == "" {
				return fmt.Errorf("%w: class %d has an empty label name", ErrInvalid, i)
			}
			if j, dup := seen[name]; dup {
				return fmt.Errorf("%w: label name %q is class %d and class %d", ErrInvalid, name, j, i)
			}
			seen[name] = i
		}
	}
	if d.FeatureNames != nil && len(d.FeatureNames) != d.Dim {
		return fmt.Errorf("%w: %d feature names for %d features", ErrInvalid, len(d.FeatureNames), d.Dim)
	}
	for i, y := range d.Y {
		if y < 0 || int(y) >= d.Classes {
			return fmt.Errorf("%w: row %d: label %d outside [0, %d)", ErrInvalid, i, y, d.Classes)
		}
	}
	for j, v := range d.X {
		f := float64(v)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("%w: row %d, feature %d: non-finite value %v", ErrInvalid, j/d.Dim, j%d.Dim, v)
		}
		if d.Vocab > 0 && (f != math.Trunc(f) || f < -1 || f >= float64(d.Vocab)) {
			return fmt.Errorf("%w: row %d, position %d: token %v not an integer in [-1, %d)", ErrInvalid, j/d.Dim, j%d.Dim, v, d.Vocab)
		}
	}
	return nil
}

// ContentHash returns the SHA-256 (lower-case hex) of the dataset's
// content: its shape (Dim, Shape, Classes, Vocab, Len) and every feature
// and label, little-endian. Two datasets with the same examples in the
// same order hash the same whatever files they were read from; it is the
// identity a dataset's privacy budget is kept under
// (ledger.DatasetBudget). Name is not hashed.
func (d *Dataset) ContentHash() string {
	h := sha256.New()
	var buf [8]byte
	put := func(v int) {
		binary.LittleEndian.PutUint64(buf[:], uint64(v))
		h.Write(buf[:])
	}
	h.Write([]byte("dpcluster dataset v1\x00"))
	put(d.Dim)
	put(len(d.Shape))
	for _, s := range d.Shape {
		put(s)
	}
	put(d.Classes)
	put(d.Vocab)
	put(d.Len())
	chunk := make([]byte, 0, 1<<16)
	for i, v := range d.X {
		chunk = binary.LittleEndian.AppendUint32(chunk, math.Float32bits(v))
		if len(chunk) == cap(chunk) || i == len(d.X)-1 {
			h.Write(chunk)
			chunk = chunk[:0]
		}
	}
	for i, y := range d.Y {
		chunk = binary.LittleEndian.AppendUint32(chunk, uint32(y))
		if len(chunk) == cap(chunk) || i == len(d.Y)-1 {
			h.Write(chunk)
			chunk = chunk[:0]
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

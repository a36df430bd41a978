package dataset

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// GaussianMixture returns n examples in dim dimensions from classes
// isotropic Gaussians, for quick tests: class c has mean μ_c = separation·u_c
// with u_c a random unit vector, labels are uniform over classes, and
// x = μ_c + ε with ε ~ N(0, I). With separation ≳ 4 the classes are nearly
// linearly separable; with 0 the labels are pure noise. Deterministic in
// all arguments.
func GaussianMixture(n, dim, classes int, separation float64, seed uint64) (*Dataset, error) {
	if n < 0 || dim < 1 || classes < 1 {
		return nil, fmt.Errorf("dataset: GaussianMixture(n=%d, dim=%d, classes=%d) needs n ≥ 0, dim ≥ 1, classes ≥ 1", n, dim, classes)
	}
	if !(separation >= 0) || math.IsInf(separation, 0) {
		return nil, fmt.Errorf("dataset: GaussianMixture separation %v must be finite and ≥ 0", separation)
	}
	r := newRand(seed)
	means := randomDirections(r.NormFloat64, classes, dim, separation)
	d := &Dataset{
		Name:    fmt.Sprintf("gaussian-mixture-%dc", classes),
		X:       make([]float32, n*dim),
		Y:       make([]int32, n),
		Dim:     dim,
		Classes: classes,
	}
	for i := range n {
		c := r.IntN(classes)
		d.Y[i] = int32(c)
		row := d.X[i*dim : (i+1)*dim]
		for j := range row {
			row[j] = float32(means[c*dim+j] + r.NormFloat64())
		}
	}
	return d, nil
}

// randomDirections returns k vectors of length scale in dim dimensions,
// uniformly distributed directions (normalized Gaussians), row-major.
func randomDirections(norm func() float64, k, dim int, scale float64) []float64 {
	out := make([]float64, k*dim)
	for c := range k {
		v := out[c*dim : (c+1)*dim]
		ss := 0.0
		for ss == 0 {
			for j := range v {
				v[j] = norm()
				ss += v[j] * v[j]
			}
		}
		f := scale / math.Sqrt(ss)
		for j := range v {
			v[j] *= f
		}
	}
	return out
}

// ZipfConfig configures ZipfClasses.
type ZipfConfig struct {
	N       int // number of examples
	Dim     int // input dimension
	Classes int // number of classes (Kunstner et al. use ~1000s)
	// Exponent is s in p_k ∝ 1/k^s (k = 1..Classes). s = 1 is the
	// heavy-tailed regime of word frequencies; s = 0 is uniform.
	Exponent float64
	// Separation is the length of every class mean.
	Separation float64
	// Noise is the per-coordinate standard deviation of the Gaussian noise
	// added to the class mean.
	Noise float64
	Seed  uint64
}

// DefaultZipfConfig returns a 1000-class, 64-dimensional task with Zipf
// exponent 1. Unit-length random means in 64 dimensions have pairwise cosine
// below about 0.5, so with Noise 0.1 the nearest-mean rule (a linear
// classifier) is almost always right: what makes the task hard for an
// optimizer is only the class imbalance.
func DefaultZipfConfig() ZipfConfig {
	return ZipfConfig{N: 20000, Dim: 64, Classes: 1000, Exponent: 1, Separation: 1, Noise: 0.1, Seed: 1}
}

// Validate checks ranges.
func (c ZipfConfig) Validate() error {
	var errs []error
	if c.N < 0 {
		errs = append(errs, fmt.Errorf("N %d < 0", c.N))
	}
	if c.Dim < 1 {
		errs = append(errs, fmt.Errorf("Dim %d < 1", c.Dim))
	}
	if c.Classes < 1 {
		errs = append(errs, fmt.Errorf("Classes %d < 1", c.Classes))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"Exponent", c.Exponent}, {"Separation", c.Separation}, {"Noise", c.Noise}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("%s %v must be finite and ≥ 0", f.name, f.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("dataset: ZipfConfig: %w", err)
	}
	return nil
}

// ZipfProbabilities returns p_k ∝ 1/k^s for k = 1..classes (index k-1),
// normalized to sum to 1 (summed smallest first for accuracy).
func ZipfProbabilities(classes int, s float64) []float64 {
	p := make([]float64, classes)
	sum := 0.0
	for k := classes; k >= 1; k-- {
		p[k-1] = math.Pow(float64(k), -s)
		sum += p[k-1]
	}
	for k := range p {
		p[k] /= sum
	}
	return p
}

// ZipfClasses returns the heavy-tailed class-imbalance task of Kunstner,
// Yadav, Milligan, Schmidt and Bietti 2024 ("Heavy-tailed class imbalance
// and why Adam outperforms gradient descent on language models",
// arXiv:2402.19449): many classes whose frequencies follow a Zipf law,
// p_k ∝ 1/k^s, as word frequencies do in language data. Class 0 is the most
// frequent. Each class k has a random mean direction μ_k of length
// Separation, and an example of class k is x = μ_k + Noise·N(0, I), so a
// linear softmax model can fit the task; under heavy tails most classes are
// rare, which is what slows gradient descent (and, the paper argues, not
// Adam). Labels are drawn i.i.d. from p by inverting the cumulative
// distribution. Deterministic in cfg. Use Split for a train/test split.
func ZipfClasses(cfg ZipfConfig) (*Dataset, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := newRand(cfg.Seed)
	means := randomDirections(r.NormFloat64, cfg.Classes, cfg.Dim, cfg.Separation)
	p := ZipfProbabilities(cfg.Classes, cfg.Exponent)
	cdf := make([]float64, len(p))
	acc := 0.0
	for k, pk := range p {
		acc += pk
		cdf[k] = acc
	}
	cdf[len(cdf)-1] = 1 // absorb rounding so every draw lands on a class
	d := &Dataset{
		Name:    fmt.Sprintf("zipf-%dc-s%g", cfg.Classes, cfg.Exponent),
		X:       make([]float32, cfg.N*cfg.Dim),
		Y:       make([]int32, cfg.N),
		Dim:     cfg.Dim,
		Classes: cfg.Classes,
	}
	for i := range cfg.N {
		u := r.Float64()
		// Class k when cdf[k-1] ≤ u < cdf[k]: the first k with cdf[k] > u.
		c := min(sort.Search(len(cdf), func(k int) bool { return cdf[k] > u }), cfg.Classes-1)
		d.Y[i] = int32(c)
		row := d.X[i*cfg.Dim : (i+1)*cfg.Dim]
		for j := range row {
			row[j] = float32(means[c*cfg.Dim+j] + cfg.Noise*r.NormFloat64())
		}
	}
	return d, nil
}

// FromTokens builds a token-sequence Dataset: row i holds docs[i]'s first
// maxLen token ids (as exact float32 integers), padded with -1 when shorter;
// its label is labels[i]. Shape is [maxLen], Vocab is vocab. Token ids must
// lie in [0, vocab), vocab ≤ MaxTokenID, labels in [0, classes). The input
// slices are not retained.
func FromTokens(docs [][]int32, labels []int32, maxLen, vocab, classes int) (*Dataset, error) {
	if len(docs) != len(labels) {
		return nil, fmt.Errorf("%w: %d documents but %d labels", ErrInvalid, len(docs), len(labels))
	}
	if maxLen < 1 || vocab < 1 || vocab > MaxTokenID || classes < 1 {
		return nil, fmt.Errorf("%w: FromTokens(maxLen=%d, vocab=%d, classes=%d) needs maxLen ≥ 1, 1 ≤ vocab ≤ %d, classes ≥ 1",
			ErrInvalid, maxLen, vocab, classes, MaxTokenID)
	}
	d := &Dataset{
		Name:    "tokens",
		X:       make([]float32, len(docs)*maxLen),
		Y:       make([]int32, len(docs)),
		Dim:     maxLen,
		Shape:   []int{maxLen},
		Classes: classes,
		Vocab:   vocab,
	}
	for i, doc := range docs {
		if labels[i] < 0 || int(labels[i]) >= classes {
			return nil, fmt.Errorf("%w: document %d: label %d outside [0, %d)", ErrInvalid, i, labels[i], classes)
		}
		d.Y[i] = labels[i]
		row := d.X[i*maxLen : (i+1)*maxLen]
		for j := range row {
			if j >= len(doc) {
				row[j] = -1
				continue
			}
			if doc[j] < 0 || int(doc[j]) >= vocab {
				return nil, fmt.Errorf("%w: document %d, position %d: token %d outside [0, %d)", ErrInvalid, i, j, doc[j], vocab)
			}
			row[j] = float32(doc[j])
		}
	}
	return d, nil
}

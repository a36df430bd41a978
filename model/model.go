package model

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/dpcluster/dpcluster/dataset"
)

// ErrShape is returned (wrapped) when a parameter vector, batch, label or
// destination has the wrong length or a value out of range (a label outside
// [0, Classes), a token id outside [-1, Vocab)).
var ErrShape = errors.New("model: shape mismatch")

// ErrNonFinite is returned when parameters are not finite, or when MeanGrad
// or Evaluate meet NaN or ±Inf (for instance from huge inputs). ClippedSum
// does not return it for an example whose gradient is not finite: that
// example contributes zero. The destination then holds unspecified values
// and must not be used.
var ErrNonFinite = errors.New("model: non-finite value")

// ErrBadClip is returned when the clipping norm is not a number in
// [MinClipNorm, MaxClipNorm] (see CheckClipNorm).
var ErrBadClip = errors.New("model: clip norm out of range")

// ParamInfo names one parameter tensor: a view theta[Offset:Offset+Size]
// of the flat parameter vector, with a row-major Shape.
type ParamInfo struct {
	Name   string
	Shape  []int
	Offset int
	Size   int
}

// Model is a validated spec with its parameter layout. It holds no
// trainable parameters itself: every method takes the flat vector theta
// of the parameters that train (all of them unless the spec freezes some;
// see Spec.Trainable and WithFrozen, freeze.go). A Model is immutable and
// safe for concurrent use; computing gradients needs a Workspace (one per
// goroutine).
type Model struct {
	spec   Spec
	hash   string
	layers []layer
	// params are the trainable parameters, offsets in theta; full are
	// all of them, offsets in the full layout (the two are the same
	// unless some layer is frozen).
	params    []ParamInfo
	full      []ParamInfo
	layerOff  []int // offset of layer i's parameters in the full layout
	layerSize []int // number of parameters of layer i
	numParams int   // len(theta): the trainable parameters
	numFull   int   // every parameter
	// The frozen layers' plan (freeze.go): leaves[i] are layer i's units
	// of parameters (its nested layers for a residual block, else
	// itself); tauOff[i], tauSize[i] the place of layer i's trainable
	// parameters in theta; frozen whether any unit is frozen; base the
	// frozen values in the full layout (WithFrozen), never written.
	leaves          [][]leaf
	tauOff, tauSize []int
	frozen          bool
	base            []float32
	inShape         []int
	inSize          int
	classes         int
	vocab           int // > 0 when the first layer is an embedding bag or embedding
	// seqT is, for the NextToken loss, the number of positions T the
	// layers see (the input holds T+1 ids); 0 otherwise.
	seqT    int
	backend Backend
}

// New validates spec and builds its parameter layout with DefaultBackend.
// Errors wrap ErrInvalidSpec.
func New(spec Spec) (*Model, error) { return NewWithBackend(spec, DefaultBackend()) }

// NewWithBackend is New with an explicit compute back end.
func NewWithBackend(spec Spec, be Backend) (*Model, error) {
	if be == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidSpec)
	}
	m, err := plan(spec)
	if err != nil {
		return nil, err
	}
	m.backend = be
	return m, nil
}

// plan normalizes and validates a spec and infers every layer's shape.
func plan(s Spec) (*Model, error) {
	s = s.normalized()
	if s.Loss != SoftmaxCrossEntropy && s.Loss != NextToken {
		return nil, fmt.Errorf("%w: unknown loss %q (have %q, %q)", ErrInvalidSpec, s.Loss, SoftmaxCrossEntropy, NextToken)
	}
	if len(s.Input) != 1 && len(s.Input) != 3 {
		return nil, fmt.Errorf("%w: input shape %v must be [D] or [C, H, W]", ErrInvalidSpec, s.Input)
	}
	inSize := shapeSize(s.Input)
	if inSize < 1 {
		return nil, fmt.Errorf("%w: input shape %v has a non-positive or huge dimension", ErrInvalidSpec, s.Input)
	}
	if s.Classes < 2 || s.Classes > maxElems {
		return nil, fmt.Errorf("%w: classes = %d, need ≥ 2", ErrInvalidSpec, s.Classes)
	}
	if len(s.Layers) == 0 {
		return nil, fmt.Errorf("%w: no layers", ErrInvalidSpec)
	}
	m := &Model{spec: s, inShape: slices.Clone(s.Input), inSize: inSize, classes: s.Classes}
	shape := slices.Clone(s.Input)
	if s.Loss == NextToken {
		if len(s.Input) != 1 || s.Input[0] < 2 {
			return nil, fmt.Errorf("%w: loss %s needs input [T+1] token ids with T ≥ 1, got %v", ErrInvalidSpec, s.Loss, s.Input)
		}
		m.seqT = s.Input[0] - 1
		shape = []int{m.seqT}
	}
	names := map[string]bool{}
	off := 0
	for i, ls := range s.Layers {
		l, err := buildLayer(i, ls, shape)
		if err != nil {
			return nil, fmt.Errorf("%w: layer %d (%s) on input %v: %v", ErrInvalidSpec, i, ls.Type, shape, err)
		}
		switch l.(type) {
		case *embedBag, *seqEmbed:
			m.vocab = ls.Vocab
		}
		prefix := ls.Name
		if prefix == "" {
			prefix = fmt.Sprint(i)
		}
		m.layerOff = append(m.layerOff, off)
		start := off
		for _, p := range l.paramShapes() {
			name := prefix + "." + p.name
			if names[name] {
				return nil, fmt.Errorf("%w: layer %d: duplicate parameter name %q", ErrInvalidSpec, i, name)
			}
			names[name] = true
			n := shapeSize(p.shape)
			if n < 1 || off > maxElems-n {
				return nil, fmt.Errorf("%w: layer %d: parameter %q too large", ErrInvalidSpec, i, name)
			}
			m.full = append(m.full, ParamInfo{Name: name, Shape: p.shape, Offset: off, Size: n})
			off += n
		}
		m.layerSize = append(m.layerSize, off-start)
		m.layers = append(m.layers, l)
		shape = l.outShape()
		if shapeSize(shape) < 1 {
			return nil, fmt.Errorf("%w: layer %d (%s) output %v is empty or too large", ErrInvalidSpec, i, ls.Type, shape)
		}
	}
	if err := m.checkHead(shape); err != nil {
		return nil, err
	}
	if err := m.checkInputIDs(); err != nil {
		return nil, err
	}
	if off == 0 {
		return nil, fmt.Errorf("%w: model has no parameters", ErrInvalidSpec)
	}
	m.numFull = off
	h, err := s.Hash()
	if err != nil {
		return nil, err
	}
	m.hash = h
	if err := m.planTrainable(); err != nil {
		return nil, err
	}
	return m, nil
}

// Spec returns the normalized spec (defaults filled in).
func (m *Model) Spec() Spec {
	return m.spec.normalized()
}

// Hash returns Spec().Hash(), and for a model with frozen values
// (WithFrozen) a hash of that and of the frozen values, so that two
// processes whose frozen weights differ in any bit run different models.
func (m *Model) Hash() string { return m.hash }

// NumParams returns the length of the flat parameter vector theta: the
// number of trainable parameters.
func (m *Model) NumParams() int { return m.numParams }

// Params returns the named tensor views of the parameter vector, in order.
func (m *Model) Params() []ParamInfo {
	out := make([]ParamInfo, len(m.params))
	for i, p := range m.params {
		p.Shape = slices.Clone(p.Shape)
		out[i] = p
	}
	return out
}

// Param returns the view of theta holding the named tensor, or false.
func (m *Model) Param(theta []float32, name string) ([]float32, bool) {
	if len(theta) != m.numParams {
		return nil, false
	}
	for _, p := range m.params {
		if p.Name == name {
			return theta[p.Offset : p.Offset+p.Size : p.Offset+p.Size], true
		}
	}
	return nil, false
}

// InputShape returns the per-example input shape.
func (m *Model) InputShape() []int { return slices.Clone(m.inShape) }

// InputSize returns the number of float32 values per example.
func (m *Model) InputSize() int { return m.inSize }

// Classes returns the number of classes.
func (m *Model) Classes() int { return m.classes }

// Backend returns the compute back end.
func (m *Model) Backend() Backend { return m.backend }

// CheckDataset reports whether d fits the model: same per-example size,
// shape (if d.Shape is set), number of classes (except for NextToken
// models, whose labels are not used) and, for token models, a vocabulary no
// larger than the embedding table.
func (m *Model) CheckDataset(d *dataset.Dataset) error {
	if d == nil {
		return fmt.Errorf("%w: nil dataset", ErrShape)
	}
	if d.Dim != m.inSize {
		return fmt.Errorf("%w: dataset %q has %d features, model wants %d (%v)", ErrShape, d.Name, d.Dim, m.inSize, m.inShape)
	}
	if d.Shape != nil && len(d.Shape) == len(m.inShape) && !slices.Equal(d.Shape, m.inShape) {
		return fmt.Errorf("%w: dataset %q has shape %v, model wants %v", ErrShape, d.Name, d.Shape, m.inShape)
	}
	if d.Classes != m.classes && m.seqT == 0 {
		return fmt.Errorf("%w: dataset %q has %d classes, model has %d", ErrShape, d.Name, d.Classes, m.classes)
	}
	if m.vocab > 0 && (d.Vocab < 1 || d.Vocab > m.vocab) {
		return fmt.Errorf("%w: dataset %q has vocabulary %d, model's embedding has %d rows", ErrShape, d.Name, d.Vocab, m.vocab)
	}
	return nil
}

// Init writes deterministic initial parameters for seed into dst (length
// NumParams): the same seed gives the same bits on every machine. Weights and
// biases of linear and conv layers are uniform in ±1/sqrt(fan_in) (PyTorch's
// default, He et al. 2015 "Delving deep into rectifiers" with a = √5),
// embeddings are N(0, 1) (PyTorch's nn.EmbeddingBag), layer-norm gains 1 and
// biases 0. The generator is PCG (math/rand/v2) seeded per tensor, so
// adding a layer does not change earlier tensors.
//
// For a model with frozen layers, dst holds the trainable parameters only
// and Init copies them from the values WithFrozen was given (the run's
// θ₀ is the checkpoint or the initialization they came from); seed is
// not used, and a model without them is an error.
func (m *Model) Init(dst []float32, seed uint64) error {
	if len(dst) != m.numParams {
		return fmt.Errorf("%w: Init dst has %d values, want %d", ErrShape, len(dst), m.numParams)
	}
	if m.frozen {
		if m.base == nil {
			return errNoBase
		}
		return m.Gather(dst, m.base)
	}
	return m.InitFull(dst, seed)
}

// InitFull is Init of the full layout (NumFullParams values), frozen
// layers included: the values a model that freezes layers is given with
// WithFrozen when they come from no checkpoint, and the tensors a
// checkpoint lacks (a head, LoRA adapters, whose B starts at zero).
func (m *Model) InitFull(dst []float32, seed uint64) error {
	if len(dst) != m.numFull {
		return fmt.Errorf("%w: InitFull dst has %d values, want %d", ErrShape, len(dst), m.numFull)
	}
	for li, l := range m.layers {
		w := dst[m.layerOff[li] : m.layerOff[li]+m.layerSize[li]]
		rng := rand.New(rand.NewPCG(seed, uint64(li)*0x9e3779b97f4a7c15+1))
		l.init(w, rng)
	}
	return nil
}

// uniformInit fills w with U(-bound, bound) drawn from rng.
func uniformInit(w []float32, bound float64, rng *rand.Rand) {
	for i := range w {
		w[i] = float32((2*rng.Float64() - 1) * bound)
	}
}

// allFinite reports whether every value is finite: x − x is 0 for finite x
// and NaN for ±Inf and NaN, and a NaN term makes the sum NaN (no branch per
// value).
func allFinite(v []float32) bool {
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(v); i += 2 {
		s0 += v[i] - v[i]
		s1 += v[i+1] - v[i+1]
	}
	for ; i < len(v); i++ {
		s0 += v[i] - v[i]
	}
	return s0+s1 == 0
}

package dpadam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/dpcluster/dpcluster/internal/f32le"
)

// Errors returned by UnmarshalBinary.
var (
	// ErrCorrupt is returned (wrapped, with the reason) by UnmarshalBinary
	// for data that is truncated, has trailing bytes, fails its checksum, or
	// decodes to an invalid state (bad magic, impossible dimension, NaN in
	// the moments, negative v, ...). Config errors also wrap
	// ErrInvalidConfig.
	ErrCorrupt = errors.New("dpadam: corrupt optimizer state")
	// ErrVersion is returned (wrapped) by UnmarshalBinary for a state
	// written by an unknown format version.
	ErrVersion = errors.New("dpadam: unsupported optimizer state version")
)

// The binary state format, version 1. All integers and floats are
// little-endian; floats are IEEE-754 bit patterns, so a round trip is exact.
//
//	offset  size  field
//	0       6     magic "DPADAM"
//	6       2     version uint16 = 1
//	8       1     algorithm code: 1 AdamBC, 2 Adam, 3 SGD, 4 SGDM
//	9       7     zero
//	16      80    config float64s: LearningRate, Beta1, Beta2, AdamEps,
//	              GammaPrime, Momentum, NoiseMultiplier, ClipNorm,
//	              ExpectedBatchSize, PhiScale
//	96      8     step count int64 (≥ 0)
//	104     8     dim uint64 (≥ 1)
//	112     4·k·dim  k float32 vectors of dim elements: m then v (Adam,
//	              AdamBC, k = 2), b (SGDM, k = 1), none (SGD, k = 0)
//	end−4   4     CRC-32C (Castagnoli) of every preceding byte
const (
	stateMagic      = "DPADAM"
	stateVersion    = 1
	stateHeaderSize = 112
	stateCRCSize    = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var algorithmCodes = [...]Algorithm{1: AdamBC, 2: Adam, 3: SGD, 4: SGDM}

func algorithmCode(a Algorithm) byte {
	for c, x := range algorithmCodes {
		if c > 0 && x == a {
			return byte(c)
		}
	}
	return 0
}

// vectors returns the state vectors in serialization order.
func (o *Optimizer) vectors() [][]float32 {
	switch o.cfg.Algorithm {
	case AdamBC, Adam:
		return [][]float32{o.m, o.v}
	case SGDM:
		return [][]float32{o.b}
	}
	return nil
}

func vectorCount(a Algorithm) int {
	switch a {
	case AdamBC, Adam:
		return 2
	case SGDM:
		return 1
	}
	return 0
}

// MarshalBinary encodes the whole optimizer (config, step count, dim and
// the state vectors) in the versioned, checksummed format documented in
// the source, for Raft snapshots. UnmarshalBinary of the result restores an
// optimizer whose future steps are bit-identical to this one's.
func (o *Optimizer) MarshalBinary() ([]byte, error) {
	if o.cfg.Algorithm == "" {
		return nil, ErrUninitialized
	}
	size := stateHeaderSize + 4*vectorCount(o.cfg.Algorithm)*o.dim + stateCRCSize
	return o.AppendBinary(make([]byte, 0, size))
}

// AppendBinary appends the MarshalBinary encoding to b (encoding.BinaryAppender).
func (o *Optimizer) AppendBinary(b []byte) ([]byte, error) {
	if o.cfg.Algorithm == "" {
		return nil, ErrUninitialized
	}
	start := len(b)
	b = append(b, stateMagic...)
	b = binary.LittleEndian.AppendUint16(b, stateVersion)
	b = append(b, algorithmCode(o.cfg.Algorithm), 0, 0, 0, 0, 0, 0, 0)
	c := &o.cfg
	for _, f := range [...]float64{c.LearningRate, c.Beta1, c.Beta2, c.AdamEps, c.GammaPrime,
		c.Momentum, c.NoiseMultiplier, c.ClipNorm, c.ExpectedBatchSize, c.PhiScale} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(o.step))
	b = binary.LittleEndian.AppendUint64(b, uint64(o.dim))
	for _, vec := range o.vectors() {
		b = f32le.Append(b, vec)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
}

// UnmarshalBinary replaces o's entire state (config, dim, step count and
// vectors) with the decoded data. Errors wrap ErrVersion for an unknown
// format version, ErrCorrupt for anything else malformed, and also
// ErrInvalidConfig for an invalid config; on error o is unchanged. It never
// panics and allocates only after the length has been checked against the
// declared dimension. data is not retained.
func (o *Optimizer) UnmarshalBinary(data []byte) error {
	if len(data) < len(stateMagic)+2 {
		return fmt.Errorf("%w: %d bytes, shorter than the header", ErrCorrupt, len(data))
	}
	if string(data[:len(stateMagic)]) != stateMagic {
		return fmt.Errorf("%w: bad magic %q", ErrCorrupt, data[:len(stateMagic)])
	}
	if v := binary.LittleEndian.Uint16(data[6:]); v != stateVersion {
		return fmt.Errorf("%w: version %d (this build reads %d)", ErrVersion, v, stateVersion)
	}
	if len(data) < stateHeaderSize+stateCRCSize {
		return fmt.Errorf("%w: %d bytes, shorter than the header", ErrCorrupt, len(data))
	}
	body, sum := data[:len(data)-stateCRCSize], binary.LittleEndian.Uint32(data[len(data)-stateCRCSize:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return fmt.Errorf("%w: checksum %08x, stored %08x", ErrCorrupt, got, sum)
	}

	code := int(data[8])
	if code == 0 || code >= len(algorithmCodes) {
		return fmt.Errorf("%w: unknown algorithm code %d", ErrCorrupt, code)
	}
	for _, z := range data[9:16] {
		if z != 0 {
			return fmt.Errorf("%w: nonzero reserved header bytes", ErrCorrupt)
		}
	}
	var f [10]float64
	for i := range f {
		f[i] = math.Float64frombits(binary.LittleEndian.Uint64(data[16+8*i:]))
	}
	cfg := Config{
		Algorithm:         algorithmCodes[code],
		LearningRate:      f[0],
		Beta1:             f[1],
		Beta2:             f[2],
		AdamEps:           f[3],
		GammaPrime:        f[4],
		Momentum:          f[5],
		NoiseMultiplier:   f[6],
		ClipNorm:          f[7],
		ExpectedBatchSize: f[8],
		PhiScale:          f[9],
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	step := int64(binary.LittleEndian.Uint64(data[96:]))
	if step < 0 {
		return fmt.Errorf("%w: negative step count %d", ErrCorrupt, step)
	}
	dim64 := binary.LittleEndian.Uint64(data[104:])
	k := uint64(vectorCount(cfg.Algorithm))
	payload := uint64(len(body) - stateHeaderSize)
	// Check dim against the actual length before allocating anything, and
	// without overflow: want payload == 4·k·dim.
	if dim64 == 0 || dim64 > uint64(math.MaxInt)/8 || (k == 0 && payload != 0) || (k > 0 && payload != 4*k*dim64) {
		return fmt.Errorf("%w: dim %d with %d state vectors does not match %d payload bytes",
			ErrCorrupt, dim64, k, payload)
	}
	dim := int(dim64)
	vecs := make([][]float32, k)
	p := body[stateHeaderSize:]
	for j := range vecs {
		vec := make([]float32, dim)
		f32le.Get(vec, p)
		for i, x := range vec {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("%w: state vector %d element %d is %v", ErrCorrupt, j, i, x)
			}
		}
		p = p[4*dim:]
		vecs[j] = vec
	}
	n := Optimizer{cfg: cfg, dim: dim, step: step}
	switch cfg.Algorithm {
	case AdamBC, Adam:
		n.m, n.v = vecs[0], vecs[1]
		for i, x := range n.v {
			if x < 0 {
				return fmt.Errorf("%w: second moment v[%d] = %v is negative", ErrCorrupt, i, x)
			}
		}
	case SGDM:
		n.b = vecs[0]
	}
	*o = n
	return nil
}

// CopyFrom makes o a copy of src: the configuration, the step count and
// the state vectors, reusing o's vectors where they have the right
// length. Steps applied to the copy are bit-identical to the same steps
// applied to src (Step is a pure function of the state). It is how a
// coordinator's leader keeps a second optimizer one step ahead of its
// replicated state machine without a model-sized allocation per step.
func (o *Optimizer) CopyFrom(src *Optimizer) {
	o.cfg, o.dim, o.step = src.cfg, src.dim, src.step
	o.m = copyVec(o.m, src.m)
	o.v = copyVec(o.v, src.v)
	o.b = copyVec(o.b, src.b)
}

// copyVec returns dst holding src's values (nil for a nil src), reusing
// dst's array when it has src's length.
func copyVec(dst, src []float32) []float32 {
	if src == nil {
		return nil
	}
	if len(dst) != len(src) {
		dst = make([]float32, len(src))
	}
	copy(dst, src)
	return dst
}

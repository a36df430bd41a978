package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
)

// ErrSafetensors is returned (wrapped, with the reason) by ReadSafetensors
// for a file that is not a safetensors file of the model.
var ErrSafetensors = errors.New("model: bad safetensors file")

// safetensorsEntry is one tensor's header entry.
type safetensorsEntry struct {
	DType   string `json:"dtype"`
	Shape   []int  `json:"shape"`
	Offsets [2]int `json:"data_offsets"`
}

// maxSafetensorsHeader bounds the JSON header ReadSafetensors accepts.
const maxSafetensorsHeader = 100 << 20

// WriteSafetensors writes theta in the safetensors format
// (https://github.com/huggingface/safetensors: an 8-byte little-endian
// header length, a JSON header mapping each tensor name to its dtype, shape
// and byte range, then the raw little-endian data). Tensor names and shapes
// are Params(); conv weights are [out, in, kh, kw] and linear weights
// [out, in], as PyTorch stores them. The "__metadata__" entry holds meta
// (string values, as the format requires) plus "spec_sha256" (the model's
// Hash) and "format" ("pt"), which meta cannot override.
func (m *Model) WriteSafetensors(w io.Writer, theta []float32, meta map[string]string) error {
	if len(theta) != m.numParams {
		return fmt.Errorf("%w: theta has %d values, model has %d parameters", ErrShape, len(theta), m.numParams)
	}
	md := make(map[string]string, len(meta)+2)
	maps.Copy(md, meta)
	md["spec_sha256"], md["format"] = m.hash, "pt"
	header := map[string]any{"__metadata__": md}
	for _, p := range m.params {
		header[p.Name] = safetensorsEntry{DType: "F32", Shape: p.Shape, Offsets: [2]int{4 * p.Offset, 4 * (p.Offset + p.Size)}}
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hb)%8 != 0 { // align the data; spaces are allowed by the format
		hb = append(hb, ' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hb)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hb); err != nil {
		return err
	}
	buf := make([]byte, 0, 1<<16)
	for _, v := range theta {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		if len(buf) == cap(buf) {
			if _, err := w.Write(buf); err != nil {
				return err
			}
			buf = buf[:0]
		}
	}
	_, err = w.Write(buf)
	return err
}

// ReadSafetensors reads a safetensors file of this model, as
// WriteSafetensors writes it: every parameter (and nothing else) as F32
// with its Params() name and shape, and "spec_sha256" equal to the
// model's Hash. It returns θ in the model's parameter order and the
// metadata. Any other file is an error wrapping ErrSafetensors.
func (m *Model) ReadSafetensors(r io.Reader) (theta []float32, meta map[string]string, err error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrSafetensors, fmt.Sprintf(format, args...))
	}
	var n [8]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, nil, bad("header length: %v", err)
	}
	hl := binary.LittleEndian.Uint64(n[:])
	if hl > maxSafetensorsHeader {
		return nil, nil, bad("header of %d bytes", hl)
	}
	hb := make([]byte, hl)
	if _, err := io.ReadFull(r, hb); err != nil {
		return nil, nil, bad("header: %v", err)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(hb))
	if err := dec.Decode(&raw); err != nil {
		return nil, nil, bad("header: %v", err)
	}
	if mr, ok := raw["__metadata__"]; ok {
		if err := json.Unmarshal(mr, &meta); err != nil {
			return nil, nil, bad("metadata: %v", err)
		}
		delete(raw, "__metadata__")
	}
	if meta["spec_sha256"] != m.hash {
		return nil, nil, bad("spec_sha256 %q, the model's is %s", meta["spec_sha256"], m.hash)
	}
	if len(raw) != len(m.params) {
		return nil, nil, bad("%d tensors, the model has %d", len(raw), len(m.params))
	}
	data := make([]byte, 4*m.numParams)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, nil, bad("data: %v", err)
	}
	if k, _ := r.Read(make([]byte, 1)); k != 0 {
		return nil, nil, bad("data longer than %d bytes", len(data))
	}
	theta = make([]float32, m.numParams)
	for _, p := range m.params {
		er, ok := raw[p.Name]
		if !ok {
			return nil, nil, bad("no tensor %q", p.Name)
		}
		var e safetensorsEntry
		if err := json.Unmarshal(er, &e); err != nil {
			return nil, nil, bad("%s: %v", p.Name, err)
		}
		lo, hi := e.Offsets[0], e.Offsets[1]
		if e.DType != "F32" || !slices.Equal(e.Shape, p.Shape) || lo < 0 || hi != lo+4*p.Size || hi > len(data) {
			return nil, nil, bad("%s: %s %v at %v, want F32 %v (%d values)", p.Name, e.DType, e.Shape, e.Offsets, p.Shape, p.Size)
		}
		for i := range p.Size {
			theta[p.Offset+i] = math.Float32frombits(binary.LittleEndian.Uint32(data[lo+4*i:]))
		}
	}
	return theta, meta, nil
}

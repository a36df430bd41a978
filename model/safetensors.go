package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// WriteSafetensors writes theta in the safetensors format
// (https://github.com/huggingface/safetensors: an 8-byte little-endian
// header length, a JSON header mapping each tensor name to its dtype, shape
// and byte range, then the raw little-endian data). Tensor names and shapes
// are Params(); conv weights are [out, in, kh, kw] and linear weights
// [out, in], as PyTorch stores them. The spec hash is recorded in the
// "__metadata__" entry.
func (m *Model) WriteSafetensors(w io.Writer, theta []float32) error {
	if len(theta) != m.numParams {
		return fmt.Errorf("%w: theta has %d values, model has %d parameters", ErrShape, len(theta), m.numParams)
	}
	type entry struct {
		DType   string `json:"dtype"`
		Shape   []int  `json:"shape"`
		Offsets [2]int `json:"data_offsets"`
	}
	header := map[string]any{"__metadata__": map[string]string{"spec_sha256": m.hash, "format": "pt"}}
	for _, p := range m.params {
		header[p.Name] = entry{DType: "F32", Shape: p.Shape, Offsets: [2]int{4 * p.Offset, 4 * (p.Offset + p.Size)}}
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

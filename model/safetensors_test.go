package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"testing"
)

func TestWriteSafetensors(t *testing.T) {
	spec, _ := Preset("cnn")
	m, _ := New(spec)
	theta := make([]float32, m.NumParams())
	_ = m.Init(theta, 3)
	var buf bytes.Buffer
	if err := m.WriteSafetensors(&buf, theta); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	hl := int(binary.LittleEndian.Uint64(b[:8]))
	var header map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+hl], &header); err != nil {
		t.Fatal(err)
	}
	data := b[8+hl:]
	if len(data) != 4*len(theta) || (8+hl)%8 != 0 {
		t.Fatalf("data %d bytes, header %d", len(data), hl)
	}
	for _, p := range m.Params() {
		var e struct {
			DType   string `json:"dtype"`
			Shape   []int  `json:"shape"`
			Offsets [2]int `json:"data_offsets"`
		}
		if err := json.Unmarshal(header[p.Name], &e); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		if e.DType != "F32" || !slices.Equal(e.Shape, p.Shape) || e.Offsets[1]-e.Offsets[0] != 4*p.Size {
			t.Fatalf("%s: header entry %+v", p.Name, e)
		}
		view, _ := m.Param(theta, p.Name)
		for i, v := range view {
			got := math.Float32frombits(binary.LittleEndian.Uint32(data[e.Offsets[0]+4*i:]))
			if got != v {
				t.Fatalf("%s[%d] = %v, want %v", p.Name, i, got, v)
			}
		}
	}
	if !bytes.Contains(b[8:8+hl], []byte(m.Hash())) {
		t.Fatal("spec hash missing from metadata")
	}
	if err := m.WriteSafetensors(&buf, theta[1:]); err == nil {
		t.Fatal("short theta accepted")
	}
}

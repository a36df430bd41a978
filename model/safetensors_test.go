package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
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
	if err := m.WriteSafetensors(&buf, theta, map[string]string{"step": "7", "format": "not-pt"}); err != nil {
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
	if err := m.WriteSafetensors(&buf, theta[1:], nil); err == nil {
		t.Fatal("short theta accepted")
	}
}

// TestSafetensorsRoundTrip writes θ of every preset and reads it back:
// the same bits, the metadata given plus the reserved keys; a file of
// another model, a truncated file and trailing bytes are refused.
func TestSafetensorsRoundTrip(t *testing.T) {
	for _, name := range Presets() {
		t.Run(name, func(t *testing.T) {
			spec, _ := Preset(name)
			m, err := New(spec)
			if err != nil {
				t.Fatal(err)
			}
			theta := make([]float32, m.NumParams())
			if err := m.Init(theta, 11); err != nil {
				t.Fatal(err)
			}
			theta[0] = float32(math.Inf(-1)) // any bits survive, not only typical ones
			theta[len(theta)-1] = math.Float32frombits(0x7fc00001)
			var buf bytes.Buffer
			if err := m.WriteSafetensors(&buf, theta, map[string]string{"step": "12", "spec_sha256": "forged"}); err != nil {
				t.Fatal(err)
			}
			file := buf.Bytes()
			got, meta, err := m.ReadSafetensors(bytes.NewReader(file))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, theta, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
				t.Fatal("θ read back differs")
			}
			if meta["step"] != "12" || meta["spec_sha256"] != m.Hash() || meta["format"] != "pt" {
				t.Errorf("metadata %v", meta)
			}
			if _, _, err := m.ReadSafetensors(bytes.NewReader(file[:len(file)-1])); !errors.Is(err, ErrSafetensors) {
				t.Errorf("truncated file: %v", err)
			}
			if _, _, err := m.ReadSafetensors(bytes.NewReader(append(slices.Clone(file), 0))); !errors.Is(err, ErrSafetensors) {
				t.Errorf("trailing byte: %v", err)
			}
			other, _ := New(MLP([]int{1, 28, 28}, []int{8}, 10))
			if _, _, err := other.ReadSafetensors(bytes.NewReader(file)); !errors.Is(err, ErrSafetensors) {
				t.Errorf("another model's file: %v", err)
			}
		})
	}
}

package pretrained

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/internal/durable"
)

// Tensor is one of a checkpoint's tensors: its name and shape as the
// checkpoint has them (checkpoint.Expected) and its values in that
// layout.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// Tensors returns vec, a vector in the engine's parameter layout (θ, or a
// gradient), as the checkpoint's tensors: every parameter of Expected
// under its own name and layout (GPT-2's Conv1D weights transposed back
// to [in, out], BERT's fused query, key and value split), in Expected's
// order. The Data slices are copies.
func (mp *Mapping) Tensors(vec []float32) ([]Tensor, error) {
	if len(vec) != mp.model.NumParams() {
		return nil, fmt.Errorf("pretrained: a vector of %d values, the model has %d parameters", len(vec), mp.model.NumParams())
	}
	type at struct {
		b    binding
		part int
	}
	where := map[string]at{}
	for _, b := range mp.plan.bindings {
		for k, p := range b.parts {
			where[p] = at{b, k}
		}
	}
	var out []Tensor
	for _, e := range mp.Expected() {
		if e.Buffer || e.TiedTo != "" {
			continue
		}
		w, ok := where[e.Name]
		if !ok {
			return nil, fmt.Errorf("pretrained: the checkpoint's %s has no engine parameter (a bug in the mapping)", e.Name)
		}
		src, _ := mp.model.Param(vec, w.b.param)
		per := len(src) / len(w.b.parts)
		part := src[w.part*per : (w.part+1)*per]
		if per != e.Len() {
			return nil, fmt.Errorf("pretrained: %s has %d values, the engine's part of %s %d (a bug in the mapping)", e.Name, e.Len(), w.b.param, per)
		}
		data := make([]float32, per)
		if w.b.transposed {
			// The engine holds [out, in]; the checkpoint [in, out] = e.Shape.
			transpose(data, part, e.Shape[1], e.Shape[0])
		} else {
			copy(data, part)
		}
		out = append(out, Tensor{Name: e.Name, Shape: e.Shape, Data: data})
	}
	return out, nil
}

// Export writes theta as a checkpoint folder the model's own library
// loads: dir/model.safetensors with the checkpoint's tensor names,
// layouts and order (Tensors, F32) and dir/config.json, the imported
// config.json with the classification head filled in (architectures
// BertForSequenceClassification or GPT2ForSequenceClassification,
// num_labels, and id2label/label2id from labels when given). Each file is
// written to a temporary file, fsynced and renamed; dir is created if
// needed. meta goes into the safetensors header's __metadata__.
func (mp *Mapping) Export(dir string, theta []float32, labels []string, meta map[string]string) error {
	tensors, err := mp.Tensors(theta)
	if err != nil {
		return err
	}
	cfg, err := mp.exportConfig(labels)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := durable.Replace(filepath.Join(dir, WeightsFile), 0o644, func(f *os.File) error {
		return WriteSafetensors(f, tensors, meta)
	}); err != nil {
		return fmt.Errorf("pretrained: writing %s: %w", WeightsFile, err)
	}
	if err := durable.Replace(filepath.Join(dir, ConfigFile), 0o644, func(f *os.File) error {
		_, err := f.Write(cfg)
		return err
	}); err != nil {
		return fmt.Errorf("pretrained: writing %s: %w", ConfigFile, err)
	}
	return nil
}

// exportConfig returns the imported config.json with the head's keys set.
func (mp *Mapping) exportConfig(labels []string) ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(mp.ConfigJSON, &cfg); err != nil {
		return nil, fmt.Errorf("pretrained: the imported config.json: %w", err)
	}
	arch := map[checkpoint.Family]string{checkpoint.BERT: "BertForSequenceClassification", checkpoint.GPT2: "GPT2ForSequenceClassification"}
	cfg["architectures"] = []string{arch[mp.Config.Family]}
	cfg["num_labels"] = mp.Options.Classes
	delete(cfg, "id2label")
	delete(cfg, "label2id")
	if len(labels) == mp.Options.Classes {
		id2label, label2id := map[string]string{}, map[string]int{}
		for i, l := range labels {
			id2label[strconv.Itoa(i)] = l
			label2id[l] = i
		}
		cfg["id2label"], cfg["label2id"] = id2label, label2id
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	return append(out, '\n'), err
}

// WriteSafetensors writes tensors to w as F32 in the safetensors format
// (an 8-byte little-endian header length, the JSON header, the raw data
// in the tensors' order), the header padded with spaces to 8 bytes as the
// reference implementation does; meta, with "format": "pt", is the
// header's __metadata__.
func WriteSafetensors(w io.Writer, tensors []Tensor, meta map[string]string) error {
	type entry struct {
		DType   string   `json:"dtype"`
		Shape   []int    `json:"shape"`
		Offsets [2]int64 `json:"data_offsets"`
	}
	md := map[string]string{"format": "pt"}
	for k, v := range meta {
		md[k] = v
	}
	header := map[string]any{"__metadata__": md}
	var off int64
	for _, t := range tensors {
		n := int64(4 * len(t.Data))
		header[t.Name] = entry{DType: "F32", Shape: t.Shape, Offsets: [2]int64{off, off + n}}
		off += n
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	if err := binary.Write(bw, binary.LittleEndian, uint64(len(hb))); err != nil {
		return err
	}
	if _, err := bw.Write(hb); err != nil {
		return err
	}
	var b [4]byte
	for _, t := range tensors {
		for _, v := range t.Data {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			if _, err := bw.Write(b[:]); err != nil {
				return err
			}
		}
	}
	return bw.Flush()
}

package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/model"
)

// raw is a safetensors file of the given header text and data bytes, with
// no padding: the length is len(header).
func raw(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// st is one tensor for build.
type st struct {
	name  string
	dtype string
	shape []int
	data  []byte
}

// build writes a well-formed safetensors file as the format's writers do:
// tensors back to back in the order given, the header padded with spaces
// to a multiple of 8 bytes.
func build(t testing.TB, meta map[string]string, tensors ...st) []byte {
	t.Helper()
	h := map[string]any{}
	if meta != nil {
		h["__metadata__"] = meta
	}
	var data []byte
	for _, x := range tensors {
		h[x.name] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int{len(data), len(data) + len(x.data)}}
		data = append(data, x.data...)
	}
	hb, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	return raw(string(hb), data)
}

func f32s(v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func newFile(b []byte) (*checkpoint.File, error) {
	return checkpoint.NewFile(bytes.NewReader(b), int64(len(b)))
}

// TestReadsTheModelWriter writes θ of every model preset with
// model.WriteSafetensors and reads it back: the same names, shapes and
// bits, and the writer's metadata.
func TestReadsTheModelWriter(t *testing.T) {
	for _, name := range model.Presets() {
		t.Run(name, func(t *testing.T) {
			spec, _ := model.Preset(name)
			m, err := model.New(spec)
			if err != nil {
				t.Fatal(err)
			}
			theta := make([]float32, m.NumParams())
			if err := m.Init(theta, 5); err != nil {
				t.Fatal(err)
			}
			theta[0] = math.Float32frombits(0x7fc00001) // any bits survive
			var buf bytes.Buffer
			if err := m.WriteSafetensors(&buf, theta, map[string]string{"step": "3"}); err != nil {
				t.Fatal(err)
			}
			f, err := newFile(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got := make([]float32, len(theta))
			var names []string
			for _, p := range m.Params() {
				names = append(names, p.Name)
				ti, ok := f.Tensor(p.Name)
				if !ok || ti.DType != checkpoint.F32 || !slices.Equal(ti.Shape, p.Shape) {
					t.Fatalf("%s: file has %+v (present %v), want F32 %v", p.Name, ti, ok, p.Shape)
				}
				if err := f.ReadFloat32(p.Name, got[p.Offset:p.Offset+p.Size]); err != nil {
					t.Fatal(err)
				}
			}
			for i := range theta {
				if math.Float32bits(got[i]) != math.Float32bits(theta[i]) {
					t.Fatalf("θ[%d] = %#x, wrote %#x", i, math.Float32bits(got[i]), math.Float32bits(theta[i]))
				}
			}
			var listed []string
			for _, ti := range f.Tensors() {
				listed = append(listed, ti.Name)
			}
			slices.Sort(names)
			if !slices.Equal(listed, names) {
				t.Fatalf("Tensors() = %v, want %v", listed, names)
			}
			if md := f.Metadata(); md["spec_sha256"] != m.Hash() || md["step"] != "3" || md["format"] != "pt" {
				t.Fatalf("metadata %v", md)
			}
		})
	}
}

// TestOpenFile opens a file on disk, reads it, closes it.
func TestOpenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, build(t, nil, st{"w", "F32", []int{2}, f32s(1, 2)}), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := checkpoint.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]float32, 2)
	if err := f.ReadFloat32("w", dst); err != nil || dst[0] != 1 || dst[1] != 2 {
		t.Fatalf("read %v, %v", dst, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Open(filepath.Join(t.TempDir(), "none.safetensors")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open of a missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("not a checkpoint"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Open(path); !errors.Is(err, checkpoint.ErrFormat) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a text file: %v", err)
	}
}

// TestValidLayouts accepts what the format allows: no tensors at all, a
// header padded with spaces, scalars, empty tensors sharing an offset,
// tensors listed out of offset order, other element types, metadata.
func TestValidLayouts(t *testing.T) {
	for _, c := range []struct {
		name string
		file []byte
		n    int
	}{
		{"no tensors", raw("{}", nil), 0},
		{"padded", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}      `, f32s(1)), 1},
		{"metadata only", raw(`{"__metadata__":{"format":"pt"}}`, nil), 0},
		{"scalar", raw(`{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, make([]byte, 8)), 1},
		{"empty tensors", raw(`{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"f":{"dtype":"F16","shape":[4,0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"z":{"dtype":"I8","shape":[0],"data_offsets":[4,4]}}`, f32s(1)), 4},
		{"out of order", raw(`{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32s(1, 2)), 2},
		{"integer buffer", raw(`{"ids":{"dtype":"I64","shape":[1,2],"data_offsets":[0,16]}}`, make([]byte, 16)), 1},
		{"unknown entry fields", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"note":"x"}}`, f32s(1)), 1},
	} {
		f, err := newFile(c.file)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := len(f.Tensors()); got != c.n {
			t.Errorf("%s: %d tensors, want %d", c.name, got, c.n)
		}
	}
}

// TestBadFiles checks that each malformed file is refused with one line
// that wraps ErrFormat and says what is wrong.
func TestBadFiles(t *testing.T) {
	tensorA := `"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`
	long := binary.LittleEndian.AppendUint64(nil, 1000)
	long = append(long, "{}"...)
	huge := binary.LittleEndian.AppendUint64(nil, 1<<40)
	for _, c := range []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "shorter than the 8-byte header length"},
		{"header length past the file", long, "header length 1000 runs past the end of the file (2 bytes after the length)"},
		{"header length over the limit", huge, "over the 100000000-byte limit"},
		{"not UTF-8", raw("{\"\xff\":{}}", nil), "not UTF-8"},
		{"not an object", raw("[]", nil), "does not start with '{'"},
		{"not JSON", raw("{a}", nil), "header: invalid character"},
		{"trailing bytes in the header", raw("{}x", nil), "header: invalid character 'x'"},
		{"duplicate tensor", raw("{"+tensorA+","+tensorA+"}", f32s(1, 2)), `key "a" appears twice`},
		{"duplicate field", raw(`{"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}`, f32s(1, 2)), `key "dtype" appears twice`},
		{"metadata not strings", raw(`{"__metadata__":{"step":1}}`, nil), "__metadata__ is not a map of strings to strings"},
		{"unknown dtype", raw(`{"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}`, []byte{0}), `tensor "w" has dtype "Q7", not one of`},
		{"sub-byte dtype", raw(`{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, []byte{0}), `tensor "w" has dtype "F4"`},
		{"no dtype", raw(`{"w":{"shape":[1],"data_offsets":[0,4]}}`, f32s(1)), `tensor "w" has no dtype`},
		{"no shape", raw(`{"w":{"dtype":"F32","data_offsets":[0,4]}}`, f32s(1)), `tensor "w" has no shape`},
		{"no offsets", raw(`{"w":{"dtype":"F32","shape":[1]}}`, f32s(1)), `tensor "w": data_offsets [] is not [BEGIN, END]`},
		{"three offsets", raw(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, f32s(1)), `data_offsets [0 4 8] is not [BEGIN, END]`},
		{"negative dimension", raw(`{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, f32s(1)), `tensor "w" has shape [-1], with a negative dimension`},
		{"fractional dimension", raw(`{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, f32s(1)), `tensor "w"`},
		{"size overflow", raw(`{"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}}`, f32s(1)), "overflows a 64-bit size"},
		{"wrong byte count", raw(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, f32s(1, 2)), `tensor "w": F32 [3] needs 12 bytes, data_offsets [0 8] hold 8`},
		{"end before begin", raw(`{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, f32s(1, 2)), "0 ≤ BEGIN ≤ END"},
		{"negative begin", raw(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, f32s(1)), "0 ≤ BEGIN ≤ END"},
		{"truncated", raw("{"+tensorA+`,"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`, f32s(1, 2, 3)), "truncated: the tensors end at byte 24 of the data section, the file holds 12 (12 bytes missing)"},
		{"overlap", raw("{"+tensorA+`,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, f32s(1, 2, 3)), `tensors "a" and "b" overlap: "b" starts at byte 4, before "a" ends at 8`},
		{"empty tensor inside another", raw("{"+tensorA+`,"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}`, f32s(1, 2)), `tensors "a" and "e" overlap`},
		{"gap", raw("{"+tensorA+`,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}`, f32s(1, 2, 3, 4)), "bytes [8, 12) of the data section are in no tensor; the format requires the tensors to cover it exactly"},
		{"gap at the start", raw(`{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32s(1, 2)), "bytes [0, 4) of the data section are in no tensor"},
		{"bytes after the last tensor", raw("{"+tensorA+"}", f32s(1, 2, 3)), "bytes [8, 12) of the data section are in no tensor"},
		{"data without tensors", raw("{}", f32s(1)), "bytes [0, 4) of the data section are in no tensor"},
	} {
		_, err := newFile(c.file)
		switch {
		case err == nil:
			t.Errorf("%s: accepted", c.name)
		case !errors.Is(err, checkpoint.ErrFormat):
			t.Errorf("%s: %v does not wrap ErrFormat", c.name, err)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %q does not say %q", c.name, err, c.want)
		case strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: %q is more than one line", c.name, err)
		}
	}
}

// TestReadFloat32 reads each float type across more than one chunk, and
// checks the refusals: a name the file lacks, an integer tensor, a dst of
// the wrong length.
func TestReadFloat32(t *testing.T) {
	const n = 300_000 // 1.2 MB as F32, 2.4 MB as F64: several 1 MiB chunks
	want := make([]float32, n)
	var b16, bb16, b32, b64 []byte
	for i := range want {
		h := uint16(i*7919) & 0x7bff // finite binary16 values
		want[i] = checkpoint.F16ToF32ForTest(h)
		b16 = binary.LittleEndian.AppendUint16(b16, h)
		bb16 = binary.LittleEndian.AppendUint16(bb16, uint16(math.Float32bits(want[i])>>16))
		b32 = binary.LittleEndian.AppendUint32(b32, math.Float32bits(want[i]))
		b64 = binary.LittleEndian.AppendUint64(b64, math.Float64bits(float64(want[i])))
	}
	file := build(t, nil,
		st{"f16", "F16", []int{n}, b16},
		st{"bf16", "BF16", []int{n}, bb16},
		st{"f32", "F32", []int{n / 1000, 1000}, b32},
		st{"ids", "I64", []int{2}, make([]byte, 16)},
		st{"f64", "F64", []int{n}, b64},
	)
	f, err := checkpoint.NewFile(eofReader{bytes.NewReader(file)}, int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"f16", "f32", "f64"} {
		got := make([]float32, n)
		if err := f.ReadFloat32(name, got); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], want[i])
			}
		}
	}
	got := make([]float32, n)
	if err := f.ReadFloat32("bf16", got); err != nil {
		t.Fatal(err)
	}
	for i := range got { // bf16 keeps the top 16 bits of each float32
		if math.Float32bits(got[i]) != math.Float32bits(want[i])&0xffff0000 {
			t.Fatalf("bf16[%d] = %#x, want %#x", i, math.Float32bits(got[i]), math.Float32bits(want[i])&0xffff0000)
		}
	}
	if err := f.ReadFloat32("nope", got); !errors.Is(err, checkpoint.ErrNoTensor) {
		t.Errorf("missing tensor: %v", err)
	}
	if err := f.ReadFloat32("ids", make([]float32, 2)); !errors.Is(err, checkpoint.ErrDType) || !strings.Contains(err.Error(), `"ids" is I64`) {
		t.Errorf("I64 tensor: %v", err)
	}
	if err := f.ReadFloat32("f16", got[1:]); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("has %d elements, dst has %d", n, n-1)) {
		t.Errorf("short dst: %v", err)
	}
	// A reader one byte shorter than the size NewFile was told: the
	// header checks pass, the read of the last tensor fails.
	short, err := checkpoint.NewFile(bytes.NewReader(file[:len(file)-1]), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	if err := short.ReadFloat32("f64", got); !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), `"f64"`) {
		t.Errorf("read past the end of the reader: %v", err)
	}
}

// eofReader returns io.EOF with a full read at the end of its input, as
// io.ReaderAt allows.
type eofReader struct{ r *bytes.Reader }

func (e eofReader) ReadAt(b []byte, off int64) (int, error) {
	n, err := e.r.ReadAt(b, off)
	if err == nil && off+int64(n) == e.r.Size() {
		err = io.EOF
	}
	return n, err
}

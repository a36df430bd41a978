package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
)

// FuzzOpen feeds arbitrary bytes to NewFile: it must not panic, and must
// either refuse them with one line wrapping ErrFormat or return a File
// whose tensors tile the data section exactly, whose shapes match their
// byte ranges, and whose float tensors all read.
func FuzzOpen(f *testing.F) {
	seed := func(header string, data ...byte) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		return append(append(b, header...), data...)
	}
	f.Add([]byte{})
	f.Add(seed("{}"))
	f.Add(seed(`{"__metadata__":{"format":"pt"}}  `))
	f.Add(seed(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)...))
	f.Add(seed(`{"a":{"dtype":"F16","shape":[1,1],"data_offsets":[0,2]},"b":{"dtype":"BF16","shape":[],"data_offsets":[2,4]},"c":{"dtype":"F64","shape":[0],"data_offsets":[4,4]}}`, 0, 0x3c, 0x80, 0x3f))
	f.Add(seed(`{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"b":{"dtype":"F64","shape":[1],"data_offsets":[8,16]}}`, make([]byte, 16)...))
	f.Add(seed(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)...))
	f.Add(seed(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 4)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := NewFile(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if !errors.Is(err, ErrFormat) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not one line wrapping ErrFormat", err)
			}
			return
		}
		ts := slices.Collect(maps.Values(file.tensors))
		slices.SortFunc(ts, func(a, b tensor) int { return cmpInt64(a.begin, b.begin)*2 + cmpInt64(a.end, b.end) })
		var at int64
		for _, x := range ts {
			if x.begin != at || x.end < x.begin {
				t.Fatalf("tensor %q at [%d, %d), expected to start at %d", x.Name, x.begin, x.end, at)
			}
			if int64(x.Len()*x.DType.Size()) != x.end-x.begin {
				t.Fatalf("tensor %q: %s %v in %d bytes", x.Name, x.DType, x.Shape, x.end-x.begin)
			}
			at = x.end
		}
		if file.data+at != int64(len(b)) {
			t.Fatalf("tensors cover %d data bytes, the file has %d", at, int64(len(b))-file.data)
		}
		listed := file.Tensors()
		if !slices.IsSortedFunc(listed, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) }) || len(listed) != len(ts) {
			t.Fatal("Tensors() is not the sorted list of tensors")
		}
		for _, x := range listed {
			err := file.ReadFloat32(x.Name, make([]float32, x.Len()))
			if x.DType.Float() != (err == nil) || (err != nil && !errors.Is(err, ErrDType)) {
				t.Fatalf("ReadFloat32(%q) of %s: %v", x.Name, x.DType, err)
			}
		}
	})
}

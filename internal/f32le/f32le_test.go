package f32le

import (
	"encoding/binary"
	"math"
	"testing"
	"unsafe"
)

// reference is the portable encoding: each value's bits, low byte first.
func reference(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

var values = []float32{0, float32(math.Copysign(0, -1)), 1, -1.5, math.MaxFloat32, math.SmallestNonzeroFloat32,
	float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xffbfffff), 3.1415927}

// TestPutGetMatchReference checks both paths (the host's and the portable
// loop) against the reference encoding, bit for bit, NaN payloads
// included, and that Get inverts Put.
func TestPutGetMatchReference(t *testing.T) {
	for _, nat := range []bool{native, false} {
		saved := native
		native = nat
		want := reference(values)
		got := make([]byte, 4*len(values)+3)
		Put(got, values)
		if string(got[:len(want)]) != string(want) || got[len(want)] != 0 {
			t.Errorf("native %v: Put = %x, want %x", nat, got, want)
		}
		if a := Append([]byte{9}, values); a[0] != 9 || string(a[1:]) != string(want) {
			t.Errorf("native %v: Append = %x", nat, a)
		}
		back := make([]float32, len(values))
		Get(back, want)
		for i := range back {
			if math.Float32bits(back[i]) != math.Float32bits(values[i]) {
				t.Errorf("native %v: Get[%d] = %08x, want %08x", nat, i, math.Float32bits(back[i]), math.Float32bits(values[i]))
			}
		}
		native = saved
	}
}

func TestShortBufferPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Put": func() { Put(make([]byte, 7), make([]float32, 2)) },
		"Get": func() { Get(make([]float32, 2), make([]byte, 7)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s into a short buffer did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestViewAndFloatsAlias(t *testing.T) {
	if !native {
		t.Skip("big-endian host: no views")
	}
	v := []float32{1, 2, 3}
	b, ok := View(v)
	if !ok || string(b) != string(reference(v)) {
		t.Fatalf("View = %x, %v", b, ok)
	}
	f, ok := Floats(b)
	if !ok || len(f) != 3 || &f[0] != &v[0] {
		t.Fatalf("Floats(View(v)) does not alias v")
	}
	if _, ok := Floats(b[1:]); ok {
		t.Error("Floats accepted a length that is not a multiple of 4")
	}
	// The tiny allocator places odd-sized buffers at any address (CI under
	// -race gave make([]byte, 9)[1:] a 4-aligned start), so the offset is
	// chosen from the address.
	buf := make([]byte, 64)
	off := int(uintptr(unsafe.Pointer(&buf[0]))%4) + 1 // the address + off is not a multiple of 4
	if _, ok := Floats(buf[off : off+8]); ok {
		t.Errorf("Floats accepted a buffer at address %% 4 = %d", uintptr(unsafe.Pointer(&buf[off]))%4)
	}
}

func BenchmarkPut(b *testing.B) {
	v := make([]float32, 1<<20)
	dst := make([]byte, 4*len(v))
	b.SetBytes(int64(len(dst)))
	for b.Loop() {
		Put(dst, v)
	}
}

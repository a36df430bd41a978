// Package f32le converts float32 vectors to and from their little-endian
// byte encoding, the format of every tensor dpcluster writes: the Raft
// log's g̃ entries, snapshots, the optimizer's state and the wire. On a
// little-endian host (every platform the project builds for) a conversion
// is one memory copy; elsewhere it is a loop over the values. Both give the
// same bytes: the IEEE 754 bits of each value, low byte first, NaN payloads
// included.
package f32le

import (
	"encoding/binary"
	"math"
	"slices"
	"unsafe"
)

// native reports whether the host stores float32 little-endian.
var native = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Put encodes v into dst[:4·len(v)]. It panics if dst is shorter.
func Put(dst []byte, v []float32) {
	dst = dst[:4*len(v)]
	if native {
		copy(dst, view(v))
		return
	}
	for i, x := range v {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
}

// Append appends the encoding of v to b.
func Append(b []byte, v []float32) []byte {
	n := len(b)
	b = slices.Grow(b, 4*len(v))[:n+4*len(v)] // no zeroing of what Put overwrites
	Put(b[n:], v)
	return b
}

// Get decodes src[:4·len(dst)] into dst. It panics if src is shorter.
func Get(dst []float32, src []byte) {
	src = src[:4*len(dst)]
	if native {
		copy(view(dst), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// View returns v's encoding without copying when the host is
// little-endian (the bytes alias v), and false otherwise.
func View(v []float32) ([]byte, bool) {
	if !native {
		return nil, false
	}
	return view(v), true
}

// Floats returns b's values without copying when the host is
// little-endian, b is 4-byte aligned and its length a multiple of 4 (the
// values alias b), and false otherwise.
func Floats(b []byte) ([]float32, bool) {
	if !native || len(b)%4 != 0 {
		return nil, false
	}
	if len(b) == 0 {
		return []float32{}, true
	}
	p := unsafe.Pointer(&b[0])
	if uintptr(p)%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(p), len(b)/4), true
}

// view returns the bytes backing v.
func view(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

package dpadam

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"testing"
)

// trained returns an optimizer of alg after steps seeded steps, with θ.
func trained(t *testing.T, alg Algorithm, dim, steps int) (*Optimizer, []float32) {
	t.Helper()
	cfg := testConfig(alg)
	cfg.PhiScale = 1.25 // a non-default value, to check it round-trips
	opt, err := New(cfg, dim)
	if err != nil {
		t.Fatal(err)
	}
	theta := make([]float32, dim)
	for _, g := range noisyGrads(17, cfg, steps, dim) {
		if _, err := opt.Step(theta, g); err != nil {
			t.Fatal(err)
		}
	}
	return opt, theta
}

func optimizersEqual(a, b *Optimizer) bool {
	return a.cfg == b.cfg && a.dim == b.dim && a.step == b.step &&
		bitsEqual(a.m, b.m) && bitsEqual(a.v, b.v) && bitsEqual(a.b, b.b) &&
		(a.m == nil) == (b.m == nil) && (a.v == nil) == (b.v == nil) && (a.b == nil) == (b.b == nil)
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			opt, _ := trained(t, alg, 37, 9)
			data := stateBytes(t, opt)
			wantLen := stateHeaderSize + 4*vectorCount(alg)*37 + stateCRCSize
			if len(data) != wantLen {
				t.Errorf("encoding is %d bytes, want %d", len(data), wantLen)
			}
			var got Optimizer
			if err := got.UnmarshalBinary(data); err != nil {
				t.Fatalf("UnmarshalBinary: %v", err)
			}
			if !optimizersEqual(&got, opt) {
				t.Fatalf("round trip changed the optimizer:\n got %+v\nwant %+v", got, *opt)
			}
			if again := stateBytes(t, &got); !bytes.Equal(again, data) {
				t.Errorf("re-encoding differs from the original encoding")
			}
			// AppendBinary appends after existing bytes.
			prefix := []byte("xyz")
			app, err := opt.AppendBinary(prefix)
			if err != nil || !bytes.Equal(app[:3], prefix) || !bytes.Equal(app[3:], data) {
				t.Errorf("AppendBinary = %v, %v; want prefix + encoding", len(app), err)
			}
		})
	}
}

// TestRestoredContinuesIdentically checks what Raft snapshots need: an
// optimizer restored mid-run and the uninterrupted one produce the same
// bits from then on.
func TestRestoredContinuesIdentically(t *testing.T) {
	const dim, steps, cut = 101, 30, 13
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			cfg := testConfig(alg)
			grads := noisyGrads(29, cfg, steps, dim)
			a, err := New(cfg, dim)
			if err != nil {
				t.Fatal(err)
			}
			thetaA := make([]float32, dim)
			for i := range thetaA {
				thetaA[i] = float32(i) / dim
			}
			for _, g := range grads[:cut] {
				if _, err := a.Step(thetaA, g); err != nil {
					t.Fatal(err)
				}
			}
			var b Optimizer
			if err := b.UnmarshalBinary(stateBytes(t, a)); err != nil {
				t.Fatal(err)
			}
			thetaB := append([]float32(nil), thetaA...)
			for s, g := range grads[cut:] {
				da, errA := a.Step(thetaA, g)
				db, errB := b.Step(thetaB, g)
				if errA != nil || errB != nil {
					t.Fatal(errA, errB)
				}
				if da != db || !bitsEqual(thetaA, thetaB) {
					t.Fatalf("step %d: restored optimizer diverged (diagnostics %+v vs %+v)", cut+s+1, db, da)
				}
			}
			if !optimizersEqual(a, &b) {
				t.Errorf("final states differ")
			}
		})
	}
}

// reseal recomputes the trailing CRC so a test can corrupt a field and
// reach the semantic checks behind the checksum.
func reseal(data []byte) []byte {
	body := data[:len(data)-stateCRCSize]
	binary.LittleEndian.PutUint32(data[len(body):], crc32.Checksum(body, castagnoli))
	return data
}

func TestUnmarshalRejects(t *testing.T) {
	opt, _ := trained(t, AdamBC, 5, 3)
	valid := stateBytes(t, opt)
	edit := func(f func(b []byte) []byte) []byte {
		return f(append([]byte(nil), valid...))
	}
	putF64 := func(b []byte, off int, x float64) []byte {
		binary.LittleEndian.PutUint64(b[off:], math.Float64bits(x))
		return reseal(b)
	}
	tests := []struct {
		name  string
		data  []byte
		want  error
		want2 error // also matched, if non-nil
	}{
		{"nil", nil, ErrCorrupt, nil},
		{"short", valid[:7], ErrCorrupt, nil},
		{"bad magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), ErrCorrupt, nil},
		{"version 0", edit(func(b []byte) []byte { b[6] = 0; return b }), ErrVersion, nil},
		{"version 2", edit(func(b []byte) []byte { b[6] = 2; return reseal(b) }), ErrVersion, nil},
		{"header only", valid[:stateHeaderSize], ErrCorrupt, nil},
		{"truncated payload", valid[:len(valid)-5], ErrCorrupt, nil},
		{"truncated resealed", reseal(append([]byte(nil), valid[:len(valid)-4]...)), ErrCorrupt, nil},
		{"trailing byte", append(append([]byte(nil), valid...), 0), ErrCorrupt, nil},
		{"flipped payload bit", edit(func(b []byte) []byte { b[stateHeaderSize+3] ^= 1; return b }), ErrCorrupt, nil},
		{"flipped crc", edit(func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b }), ErrCorrupt, nil},
		{"algorithm 0", edit(func(b []byte) []byte { b[8] = 0; return reseal(b) }), ErrCorrupt, nil},
		{"algorithm 9", edit(func(b []byte) []byte { b[8] = 9; return reseal(b) }), ErrCorrupt, nil},
		{"algorithm sgd with adam payload", edit(func(b []byte) []byte { b[8] = 3; return reseal(b) }), ErrCorrupt, nil},
		{"reserved byte", edit(func(b []byte) []byte { b[12] = 1; return reseal(b) }), ErrCorrupt, nil},
		{"NaN learning rate", edit(func(b []byte) []byte { return putF64(b, 16, math.NaN()) }), ErrCorrupt, ErrInvalidConfig},
		{"beta2 = 1", edit(func(b []byte) []byte { return putF64(b, 32, 1) }), ErrCorrupt, ErrInvalidConfig},
		{"negative step", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[96:], 1<<63)
			return reseal(b)
		}), ErrCorrupt, nil},
		{"dim 0", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[104:], 0)
			return reseal(b)
		}), ErrCorrupt, nil},
		{"dim too large", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[104:], 6)
			return reseal(b)
		}), ErrCorrupt, nil},
		{"dim huge", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[104:], math.MaxUint64/2)
			return reseal(b)
		}), ErrCorrupt, nil},
		{"NaN in m", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[stateHeaderSize:], math.Float32bits(float32(math.NaN())))
			return reseal(b)
		}), ErrCorrupt, nil},
		{"Inf in v", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[stateHeaderSize+4*5:], math.Float32bits(float32(math.Inf(1))))
			return reseal(b)
		}), ErrCorrupt, nil},
		{"negative v", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[stateHeaderSize+4*6:], math.Float32bits(-1))
			return reseal(b)
		}), ErrCorrupt, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			target, _ := trained(t, SGDM, 3, 2)
			before := stateBytes(t, target)
			err := target.UnmarshalBinary(tc.data)
			if !errors.Is(err, tc.want) || (tc.want2 != nil && !errors.Is(err, tc.want2)) {
				t.Fatalf("UnmarshalBinary = %v, want %v (and %v)", err, tc.want, tc.want2)
			}
			if after := stateBytes(t, target); !bytes.Equal(after, before) {
				t.Errorf("failed UnmarshalBinary modified the optimizer")
			}
		})
	}
}

// TestUnmarshalEveryTruncation decodes every prefix of valid encodings:
// each must fail cleanly.
func TestUnmarshalEveryTruncation(t *testing.T) {
	for _, alg := range algorithms {
		opt, _ := trained(t, alg, 4, 2)
		data := stateBytes(t, opt)
		for n := range len(data) {
			var o Optimizer
			if err := o.UnmarshalBinary(data[:n]); err == nil {
				t.Fatalf("%s: a %d-byte prefix of a %d-byte state decoded", alg, n, len(data))
			}
		}
	}
}

// TestCopyFromContinuesIdentically: a copy (into a fresh optimizer and into
// one of another algorithm and size, whose vectors are replaced) steps to
// the same bits as the original, and stepping the copy leaves the original
// untouched.
func TestCopyFromContinuesIdentically(t *testing.T) {
	const dim = 53
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			src, theta := trained(t, alg, dim, 7)
			before := stateBytes(t, src)
			other, _ := trained(t, SGDM, 5, 2)
			for _, dst := range []*Optimizer{{}, other} {
				dst.CopyFrom(src)
				if !optimizersEqual(dst, src) {
					t.Fatalf("CopyFrom: got %+v, want %+v", *dst, *src)
				}
				th := append([]float32(nil), theta...)
				for _, g := range noisyGrads(31, src.cfg, 3, dim) {
					if _, err := dst.Step(th, g); err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(stateBytes(t, src), before) {
					t.Fatal("stepping the copy changed the original")
				}
				ref, _ := trained(t, alg, dim, 7)
				thRef := append([]float32(nil), theta...)
				for _, g := range noisyGrads(31, src.cfg, 3, dim) {
					if _, err := ref.Step(thRef, g); err != nil {
						t.Fatal(err)
					}
				}
				if !optimizersEqual(dst, ref) || !bitsEqual(th, thRef) {
					t.Fatal("the copy's steps differ from the original's")
				}
			}
		})
	}
}

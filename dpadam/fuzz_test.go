package dpadam

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzUnmarshalBinary checks that UnmarshalBinary never panics, returns
// only its documented errors, and that whatever it accepts re-encodes to
// the same bytes and can take a step. Seeds: valid states of every
// algorithm (plus the committed corpus in testdata/fuzz).
func FuzzUnmarshalBinary(f *testing.F) {
	for _, alg := range algorithms {
		cfg := testConfig(alg)
		opt, err := New(cfg, 3)
		if err != nil {
			f.Fatal(err)
		}
		theta := make([]float32, 3)
		for _, g := range noisyGrads(1, cfg, 2, 3) {
			if _, err := opt.Step(theta, g); err != nil {
				f.Fatal(err)
			}
		}
		data, err := opt.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("DPADAM"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var o Optimizer
		err := o.UnmarshalBinary(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
				t.Fatalf("undocumented error %v", err)
			}
			if o.cfg.Algorithm != "" {
				t.Fatalf("failed UnmarshalBinary modified the optimizer")
			}
			return
		}
		again, err := o.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary after a successful decode: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("decode/encode is not the identity")
		}
		if o.Dim() > 1<<16 {
			return // DP-SGD states carry no vectors, so dim is unbounded by the input size
		}
		theta := make([]float32, o.Dim())
		grad := make([]float32, o.Dim())
		for i := range grad {
			grad[i] = float32(i%7) - 3
		}
		if _, err := o.Step(theta, grad); err != nil && !errors.Is(err, ErrStepOverflow) {
			t.Fatalf("Step on a decoded state: %v", err)
		}
	})
}

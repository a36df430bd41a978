package model

import "fmt"

// Logits writes the model's outputs for the examples x (len(x)/InputSize
// of them, at most MaxBatch) into dst: Classes values per example for a
// classifier, T·Classes (position by position) for a NextToken model. It
// is the forward pass Evaluate runs, without the loss: what a user of the
// trained model computes, and what conformance tests compare with another
// implementation. Errors: ErrShape, and the token id checks of every call.
func (w *Workspace) Logits(dst, theta, x []float32) error {
	m := w.m
	if len(x)%m.inSize != 0 {
		return fmt.Errorf("%w: x has %d values, not a whole number of examples of %d", ErrShape, len(x), m.inSize)
	}
	B := len(x) / m.inSize
	if err := w.check(nil, theta, x, make([]int32, B)); err != nil {
		return err
	}
	out := w.act[len(m.layers)]
	per := len(out) / w.maxB
	if len(dst) != B*per {
		return fmt.Errorf("%w: dst has %d values, want %d examples × %d outputs", ErrShape, len(dst), B, per)
	}
	w.forward(w.pass(B), theta, x)
	copy(dst, out[:B*per])
	return nil
}

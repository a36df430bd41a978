package model

import (
	"errors"
	"fmt"
)

// seqLinear is a linear layer applied at each of T positions of a [T, D]
// sequence: y_t = W x_t + b. A [T, D] activation stored row-major is the
// channels-last layout of a [D, T, 1] image, so the layer is a 1×1
// convolution and shares conv's kernels, per-example norms and bounds
// (conv.bound): example i's weight gradient is Σₜ dₜ x̃ₜᵀ, whose norm is
// the ghost norm from two T×T Gram matrices (Li et al. 2022, §4) or is
// materialized, chosen by cost (ghostCheaper), with conv's rigorous error
// bound on the Gram sum (the cancellation fix of issue 11 applies as is).
// Only the public shapes differ: weight [Out, D] (conv's [Out, D, 1, 1]
// in the same order) and output [T, Out]. With NoBias the convolution has
// no bias (conv.noBias).
type seqLinear struct {
	*conv
}

// newSeqLinear checks a linear layer spec against a [T, D] input.
func newSeqLinear(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if ls.Out < 1 || ls.Out > maxElems {
		return nil, fmt.Errorf("out = %d, need ≥ 1", ls.Out)
	}
	T, D := in[0], in[1]
	if shapeSize([]int{ls.Out, D}) < 1 || shapeSize([]int{T, ls.Out}) < 1 || shapeSize([]int{T, D}) < 1 {
		return nil, errors.New("layer too large")
	}
	cv := &conv{c: D, h: T, w: 1, o: ls.Out, k: 1, s: 1, p: 0, ho: T, wo: 1, T: T, K: D, noBias: ls.NoBias}
	cv.ghost = ghostCheaper(T, D, ls.Out)
	if ls.LoRA != nil {
		return newLoRALinear(ls, cv)
	}
	return &seqLinear{cv}, nil
}

func (l *seqLinear) outShape() []int { return []int{l.T, l.o} }
func (l *seqLinear) paramShapes() []paramShape {
	return weightBias(l.o, []int{l.o, l.K}, l.noBias)
}

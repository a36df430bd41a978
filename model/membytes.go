package model

// ExampleBytes is what a CPU workspace allocates per example of its batch
// capacity (NewWorkspace's maxBatch), the buffers that grow with the
// batch: the input, every layer's output and the loss gradient with
// respect to it (nested layers' too), the unfolded inputs of
// convolutions and of linear layers on sequences and their gradients, a
// materializing convolution's per-example gradients, attention's
// probabilities, layer norms' normalized inputs, max-pooling's indices
// and a LoRA layer's adapter activations. It counts a buffer whether or
// not a pass will touch it (a frozen layer's gradients are allocated but
// never written), so it is an upper estimate of the memory a pass uses;
// buffers whose size does not grow with the batch are left out. A node
// divides its memory budget by it to choose how many examples its engine
// computes at once (node.EngineBatch).
func (m *Model) ExampleBytes() int64 {
	n := int64(m.inSize)
	paramBelow := false // as NewWorkspace decides which layers write their input's gradient
	for l, ly := range m.layers {
		out := int64(shapeSize(ly.outShape()))
		n += out + exampleFloats(ly, paramBelow)
		if paramBelow || m.tauSize[l] > 0 {
			n += out // the gradient w.r.t. its output: only where a backward pass runs
		}
		paramBelow = paramBelow || m.tauSize[l] > 0
	}
	return 4 * n
}

// exampleFloats is ExampleBytes/4 for one layer, its output and the
// gradient with respect to it left out; needDin says whether it writes
// the gradient with respect to its input.
func exampleFloats(ly layer, needDin bool) int64 {
	var n int64
	unfolded := func(c *conv) int64 {
		k := int64(c.T) * int64(c.K) // cols
		if needDin {
			k *= 2 // and dcols
		}
		if !c.ghost {
			k += int64(c.o) * int64(c.K) // gi
		}
		return k
	}
	switch ly := ly.(type) {
	case *residual:
		if needDin {
			n += int64(shapeSize(ly.shape)) // the gradient w.r.t. its nested layers' input
		}
		for j, nl := range ly.layers {
			n += 2*int64(shapeSize(nl.outShape())) + exampleFloats(nl, j > 0 || needDin)
		}
	case *conv:
		n += unfolded(ly)
	case *seqLinear:
		n += unfolded(ly.conv)
	case *loraLinear:
		n += unfolded(ly.base)
		T := int64(ly.base.T)
		for _, p := range ly.parts {
			r, o := int64(p.down.o), int64(p.up.o)
			n += unfolded(p.down) + unfolded(p.up) + T*(2*r+2*o+int64(ly.base.K)) // u, du, v, g, dx
		}
	case *attention:
		n += int64(ly.H) * int64(ly.T) * int64(ly.T)
	case *seqLayerNorm:
		n += int64(ly.t) * int64(ly.f+1)
	case *layerNorm:
		n += int64(ly.f + 1)
	case *pool:
		if ly.max {
			n += int64(ly.c * ly.ho * ly.wo)
		}
	}
	return n
}

package model

import (
	"fmt"
	"strings"
)

// The plan of the CUDA engine (cuda_*.go, build tag cuda) that needs no
// driver: which layers it runs (cudaSupports) and the chain of units it
// runs a model as (cudaChain). It is in the default build so that its
// tests run on machines without a GPU, where a cuda-tagged test binary
// cannot start (cudachain_test.go); nothing else in the default build
// uses it.

// cudaSupports returns nil if the engine has kernels for every layer of m,
// nested ones included, else an error naming the first one it has none
// for.
func cudaSupports(m *Model) error {
	if m.frozen {
		return fmt.Errorf("%w: %v", ErrUnsupportedLayer, errFrozenCUDA)
	}
	for l, ly := range m.layers {
		typ := m.spec.Layers[l].Type
		if r, ok := ly.(*residual); ok {
			for j, nl := range r.layers {
				nt := layerKind(nl, m.spec.Layers[l].Layers[j].Type)
				if what := cpuOnly(nl); what != "" {
					return fmt.Errorf("%w: layer %d (%s): nested layer %d (%s) runs on the CPU engines only: the CUDA engine has no kernels for %s",
						ErrUnsupportedLayer, l, typ, j, nt, what)
				}
				if !cudaHasKernels(nl, true) {
					return fmt.Errorf("%w: layer %d (%s): nested layer %d (%s) has no CUDA kernels yet", ErrUnsupportedLayer, l, typ, j, nt)
				}
			}
			continue
		}
		if what := cpuOnly(ly); what != "" {
			return fmt.Errorf("%w: layer %d (%s) runs on the CPU engines only: the CUDA engine has no kernels for %s",
				ErrUnsupportedLayer, l, layerKind(ly, typ), what)
		}
		if !cudaHasKernels(ly, false) {
			return fmt.Errorf("%w: layer %d (%s) has no CUDA kernels yet", ErrUnsupportedLayer, l, layerKind(ly, typ))
		}
	}
	return nil
}

// cpuOnly names what makes ly a layer only the CPU engines run (the layer
// types and fields added for pretrained encoders and decoders, whose
// kernels the CUDA engine lacks until its PTX is regenerated with them),
// or returns "" if the CUDA engine has kernels for it.
func cpuOnly(ly layer) string {
	switch ly := ly.(type) {
	case *activation:
		if ly.kind == GELU || ly.kind == GELUTanh {
			return ly.kind
		}
	case *linear:
		if ly.noBias {
			return "no_bias"
		}
	case *seqLinear:
		if ly.noBias {
			return "no_bias"
		}
	case *attention:
		if ly.padding {
			return "mask padding"
		}
	case *tokenPick:
		if ly.last {
			return LastToken
		}
		return FirstToken
	case *seqEmbed:
		var what []string
		if ly.P != ly.T {
			what = append(what, "positions ≠ T")
		}
		if ly.off != 0 {
			what = append(what, "pos_offset")
		}
		if ly.NT > 0 {
			what = append(what, "types")
		}
		return strings.Join(what, ", ")
	}
	return ""
}

// cudaUnit is one unit of the engine's chain: a layer of the model (a
// seqLinear replaced by its convolution), a layer nested in a residual
// block, or one of a block's edges.
type cudaUnit interface{ outShape() []int }

// cudaResStart opens a residual block (see cuda_seq.go); end is the index of the
// block's cudaResAdd unit.
type cudaResStart struct {
	shape []int
	end   int
}

// cudaResAdd closes a residual block (see cuda_seq.go); start is the index of
// the block's cudaResStart unit, whose input is the block's.
type cudaResAdd struct {
	shape []int
	start int
}

func (r *cudaResStart) outShape() []int { return r.shape }
func (r *cudaResAdd) outShape() []int   { return r.shape }

// cudaSrc says where a unit comes from: layer l of the model and, for a
// layer nested in a residual block, its index j in the block (else -1).
type cudaSrc struct{ l, j int }

// cudaChain returns m's units in order, with each unit's parameter offset
// and count in θ and its place in the model. For a model without residual
// blocks or sequence linear layers the units are its layers, with its
// offsets and sizes.
func cudaChain(m *Model) (units []cudaUnit, off, size []int, src []cudaSrc) {
	push := func(u cudaUnit, o, n int, s cudaSrc) {
		units, off, size, src = append(units, u), append(off, o), append(size, n), append(src, s)
	}
	unit := func(ly layer) cudaUnit {
		if s, ok := ly.(*seqLinear); ok {
			return s.conv
		}
		return ly
	}
	for l, ly := range m.layers {
		o := m.layerOff[l]
		r, ok := ly.(*residual)
		if !ok {
			push(unit(ly), o, m.layerSize[l], cudaSrc{l, -1})
			continue
		}
		start := len(units)
		rs := &cudaResStart{shape: r.shape}
		push(rs, o, 0, cudaSrc{l, -1})
		for j, nl := range r.layers {
			push(unit(nl), o+r.off[j], r.size[j], cudaSrc{l, j})
		}
		rs.end = len(units)
		push(&cudaResAdd{shape: r.shape, start: start}, o+r.n, 0, cudaSrc{l, -1})
	}
	return units, off, size, src
}

// cudaHasKernels reports whether the engine runs layer ly, nested in a
// residual block or not. Not yet: a residual block inside another.
func cudaHasKernels(ly layer, nested bool) bool {
	switch ly.(type) {
	case *linear, *activation, *flatten, *conv, *pool, *layerNorm,
		*seqLinear, *seqLayerNorm, *attention, *meanPool:
		return true
	case *embedBag, *seqEmbed, *residual:
		return !nested
	}
	return false
}

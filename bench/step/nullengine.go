package main

import (
	"fmt"
	"math"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
)

// nullDevice is a model.Device whose engines cost next to nothing, so that
// bench/step -engine null times the system around the nodes' compute: the
// round, the noise, the Raft commit, the ledger, the optimizer, the
// transfers. It lives in this command (package main): no product binary
// can select it.
type nullDevice struct{}

func (nullDevice) Info() model.DeviceInfo {
	return model.DeviceInfo{ID: "null", Name: "bench/step null engine"}
}

func (nullDevice) NewEngine(m *model.Model, maxBatch int) (model.Engine, error) {
	if maxBatch < 1 {
		return nil, fmt.Errorf("%w: max batch %d < 1", model.ErrShape, maxBatch)
	}
	return &nullEngine{d: m.NumParams(), maxB: maxBatch}, nil
}

func (nullDevice) Close() error { return nil }

// nullEngine's clipped sum of n examples is n copies of the same clipped
// gradient, C·u with u = (1, −1, 1, …)/√d: a deterministic d-vector of
// norm at most n·C (its one value rounded toward zero), written in O(d),
// whatever the examples. It checks what every engine checks of its
// arguments.
type nullEngine struct{ d, maxB int }

func (e *nullEngine) ClippedSumIndexed(dst, theta []float32, ds *dataset.Dataset, idx []int, clip float64) (int, error) {
	if len(dst) != e.d || len(theta) != e.d {
		return 0, fmt.Errorf("%w: dst %d and theta %d values, model has %d parameters", model.ErrShape, len(dst), len(theta), e.d)
	}
	if err := model.CheckClipNorm(clip); err != nil {
		return 0, err
	}
	for _, i := range idx {
		if i < 0 || i >= ds.Len() {
			return 0, fmt.Errorf("%w: index %d outside dataset %q of %d rows", model.ErrShape, i, ds.Name, ds.Len())
		}
	}
	v := nullValue(len(idx), clip, e.d)
	for j := range dst {
		dst[j] = v
		if j%2 == 1 {
			dst[j] = -v
		}
	}
	return len(idx), nil
}

// nullValue is n·C/√d rounded toward zero to a float32, so that d values
// of its magnitude have norm at most n·C.
func nullValue(n int, clip float64, d int) float32 {
	exact := float64(n) * clip / math.Sqrt(float64(d))
	v := float32(exact)
	if float64(v) > exact {
		v = math.Nextafter32(v, 0)
	}
	return v
}

func (e *nullEngine) MaxBatch() int { return e.maxB }
func (e *nullEngine) Close() error  { return nil }

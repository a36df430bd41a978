package dataset

import (
	"bytes"
	"testing"

	"github.com/dpcluster/dpcluster/sampling"
)

// BenchmarkGather copies a Poisson batch of Fashion-MNIST-sized rows
// (784 features, q = 256/60000) into reusable buffers, as a node does
// every step.
func BenchmarkGather(b *testing.B) {
	const n, dim = 60000, 784
	d := &Dataset{X: make([]float32, n*dim), Y: make([]int32, n), Dim: dim, Classes: 10}
	p, err := sampling.NewSeededPoisson(256.0/n, 1)
	if err != nil {
		b.Fatal(err)
	}
	idx := make([]int, 0, 512)
	x := make([]float32, 512*dim)
	y := make([]int32, 512)
	b.ReportAllocs()
	for b.Loop() {
		idx = p.Sample(idx[:0], n)
		d.Gather(x, y, idx)
	}
}

// BenchmarkReadIDXGzip decodes a gzip-compressed 1000-image IDX file.
func BenchmarkReadIDXGzip(b *testing.B) {
	px := make([]byte, 1000*28*28)
	for i := range px {
		px[i] = byte(i * 7 % 251)
	}
	gz := gzipBytes(b, idxBytes([]int{1000, 28, 28}, px))
	b.SetBytes(int64(len(px)))
	for b.Loop() {
		if _, err := ReadIDX(bytes.NewReader(gz), int64(len(gz))); err != nil {
			b.Fatal(err)
		}
	}
}

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

// BenchmarkSharedRows compares a Fashion-MNIST-sized evaluation set (10000
// rows of 784 features) with a 60000-row training set, as LoadRun does
// for a file run's eval_path.
func BenchmarkSharedRows(b *testing.B) {
	const dim = 784
	mk := func(n int, offset float32) *Dataset {
		d := &Dataset{X: make([]float32, n*dim), Y: make([]int32, n), Dim: dim, Classes: 10}
		for i := range d.X {
			d.X[i] = float32(i%251) + offset
		}
		for i := range d.Y {
			d.Y[i] = int32(i % 10)
			d.X[i*dim] = float32(i) // every row distinct
		}
		return d
	}
	train, eval := mk(60000, 0), mk(10000, 0.5)
	b.SetBytes(int64(4 * (len(train.X) + len(eval.X))))
	for b.Loop() {
		if n := SharedRows(train, eval); n != 0 {
			b.Fatalf("SharedRows = %d, want 0", n)
		}
	}
}

package dataset_test

import (
	"fmt"
	"strings"

	"github.com/dpcluster/dpcluster/dataset"
)

func Example() {
	// A seeded synthetic task, split and sharded across three nodes.
	d, err := dataset.GaussianMixture(1000, 8, 4, 3, 1)
	if err != nil {
		panic(err)
	}
	train, test, err := dataset.Split(d, 0.2, 1)
	if err != nil {
		panic(err)
	}
	shards, err := dataset.ShardIID(train, 3, 1)
	if err != nil {
		panic(err)
	}
	fmt.Println(train.Len(), test.Len())
	for _, s := range shards {
		fmt.Println(s.Name, s.Len())
	}

	// Gather copies a batch into reusable buffers.
	x := make([]float32, 2*d.Dim)
	y := make([]int32, 2)
	d.Gather(x, y, []int{0, 1})
	fmt.Println(len(x), y[0] == d.Y[0])
	// Output:
	// 800 200
	// gaussian-mixture-4c-train-shard0 267
	// gaussian-mixture-4c-train-shard1 267
	// gaussian-mixture-4c-train-shard2 266
	// 16 true
}

func ExampleReadCSV() {
	in := "label,height,weight\n1,1.80,75\n0,1.60,52\n"
	opts := dataset.DefaultCSVOptions()
	opts.Header = true
	d, err := dataset.ReadCSV(strings.NewReader(in), opts)
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Len(), d.Dim, d.Classes, d.Row(1), d.Y)

	_, err = dataset.ReadCSV(strings.NewReader("0,1\n1,oops\n"), dataset.DefaultCSVOptions())
	fmt.Println(err)
	// Output:
	// 2 2 2 [1.6 52] [1 0]
	// dataset: malformed CSV: line 2, column 2: "oops" is not a finite number
}

func ExampleFromTokens() {
	d, err := dataset.FromTokens([][]int32{{5, 6, 7, 8}, {9}}, []int32{1, 0}, 3, 10, 2)
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Shape, d.Row(0), d.Row(1))
	// Output:
	// [3] [5 6 7] [9 -1 -1]
}

func ExampleZipfClasses() {
	cfg := dataset.DefaultZipfConfig()
	cfg.N, cfg.Classes = 5000, 100
	d, err := dataset.ZipfClasses(cfg)
	if err != nil {
		panic(err)
	}
	counts := make([]int, d.Classes)
	for _, y := range d.Y {
		counts[y]++
	}
	fmt.Println(d.Name, "head:", counts[:4], "p_1 ≈", fmt.Sprintf("%.3f", dataset.ZipfProbabilities(100, 1)[0]))
	// Output:
	// zipf-100c-s1 head: [985 486 324 245] p_1 ≈ 0.193
}

package dataset_test

import (
	"fmt"
	"os"

	"github.com/dpcluster/dpcluster/dataset"
)

// ExampleWriteSequenceCorpus cuts a corpus into next-token splits by
// document, writes them as token files (with the training documents dealt
// to two nodes), and reads one back as a node does.
func ExampleWriteSequenceCorpus() {
	docs := make([][]byte, 20)
	for i := range docs {
		docs[i] = fmt.Appendf(nil, "Document %d says hello.", i)
	}
	c := dataset.DefaultSequenceConfig()
	c.Context = 16 // windows of 17 ids: the model predicts id t+1 from ids 0..t
	dir, err := os.MkdirTemp("", "corpus")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	sf, err := dataset.WriteSequenceCorpus(dir, "hello", docs, c, 2)
	if err != nil {
		panic(err)
	}
	fmt.Println(sf.TrainRows, sf.ValidationRows, sf.TestRows, sf.ShardRows)

	d, err := dataset.ReadFile(sf.TrainShards[0], dataset.FileOptions{})
	if err != nil {
		panic(err)
	}
	text, err := dataset.ByteTokenizer{}.Decode(nil, toIDs(d.Row(0)))
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Name, d.Shape, d.Vocab, d.Row(0)[:3])
	fmt.Printf("%q\n", text)
	// Output:
	// 32 4 4 [16 16]
	// hello-train-shard-1-of-2 [17] 258 [256 68 111]
	// "Document 4 says "
}

// toIDs converts a row of float32 token ids to int32.
func toIDs(row []float32) []int32 {
	ids := make([]int32, len(row))
	for i, v := range row {
		ids[i] = int32(v)
	}
	return ids
}

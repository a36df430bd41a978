package checkpoint_test

import (
	"fmt"
	"path/filepath"

	"github.com/dpcluster/dpcluster/checkpoint"
)

// Loading a pretrained BERT (a tiny one saved as BertForPreTraining) as
// the base of a sequence classifier: the encoder and pooler are read into
// θ, the classifier is new, the pretraining heads are left out.
func Example() {
	dir := filepath.Join("testdata", "tiny-bert")
	cfg, err := checkpoint.ReadConfig(dir)
	if err != nil {
		panic(err)
	}
	f, err := checkpoint.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		panic(err)
	}
	defer f.Close()

	want := cfg.Expected(checkpoint.HeadClassifier)
	r, err := checkpoint.Check(f, want)
	if err != nil {
		panic(err)
	}
	// θ holds every parameter in the order of want; the present ones are
	// read in place, the fresh ones left for the model to initialize.
	offset, n := map[string]int{}, 0
	for _, e := range want {
		if !e.Buffer && e.TiedTo == "" {
			offset[e.Name] = n
			n += e.Len()
		}
	}
	theta := make([]float32, n)
	for _, s := range r.Present {
		i, _ := f.Tensor(s.File)
		if err := f.ReadFloat32(s.File, theta[offset[s.Name]:offset[s.Name]+i.Len()]); err != nil {
			panic(err)
		}
	}
	fmt.Printf("%s: %d layers of %d, %d labels\n", cfg.Family, cfg.Layers, cfg.Hidden, cfg.NumLabels)
	fmt.Printf("θ: %d values; %d tensors read, fresh %v\n", len(theta), len(r.Present), r.Fresh)
	fmt.Printf("buffers %v; %d unexpected, first %s\n", r.Buffers, len(r.Unexpected), r.Unexpected[0])
	// Output:
	// bert: 2 layers of 8, 2 labels
	// θ: 1642 values; 39 tensors read, fresh [classifier.weight classifier.bias]
	// buffers [bert.embeddings.position_ids]; 7 unexpected, first cls.predictions.bias
}

package model

import (
	"runtime"
	"testing"
)

// TestExampleBytes: the estimate is from 0.85 to 1.6 times what
// NewWorkspace allocates per example (the difference between capacities
// 40 and 8, measured by the runtime; the allocator's size classes blur
// small models' figures), for the presets, a BERT- and a GPT-2-shaped
// model, one with LoRA adapters and one training its last block. The
// sequence models' estimates are the higher: they count the buffers a
// pass adds later (materializing layers' per-example gradients) and some
// that a pass may not need.
func TestExampleBytes(t *testing.T) {
	var specs []Spec
	for _, name := range Presets() {
		s, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	last := frozenCases()[0]
	lastBlock := last.base.spec
	lastBlock.Name, lastBlock.Trainable = "bert-last-block", last.trainable
	specs = append(specs, bertLike(tinyBERT()), gpt2Like(tinyGPT2(), false), loraCases()[0].spec, lastBlock)
	alloc := func(m *Model, b int) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ws, err := m.NewWorkspace(b)
		if err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(ws)
		return after.TotalAlloc - before.TotalAlloc
	}
	for _, s := range specs {
		t.Run(s.Name, func(t *testing.T) {
			m := newWithBase(t, s, 1)
			per := float64(alloc(m, 40)-alloc(m, 8)) / 32
			est := float64(m.ExampleBytes())
			if r := est / per; r < 0.85 || r > 1.6 {
				t.Errorf("ExampleBytes %.0f, NewWorkspace allocates %.0f per example (ratio %.3f)", est, per, r)
			}
		})
	}
}

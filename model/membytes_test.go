package model

import (
	"runtime"
	"testing"
)

// TestExampleBytes: the estimate is from 0.85 to 1.6 times what
// NewWorkspace allocates per example (the difference between capacities
// 12 and 4, measured by the runtime; the allocator's size classes blur
// small models' figures), for the presets, a BERT- and a GPT-2-shaped
// model and one with LoRA adapters. It is above NewWorkspace's for the
// sequence models by the buffers their passes add later (materializing
// layers' per-example gradients) and those it counts whether or not a
// pass needs them.
func TestExampleBytes(t *testing.T) {
	var specs []Spec
	for _, name := range Presets() {
		s, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	specs = append(specs, bertLike(tinyBERT()), gpt2Like(tinyGPT2(), false), loraCases()[0].spec)
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
			per := float64(alloc(m, 12)-alloc(m, 4)) / 8
			est := float64(m.ExampleBytes())
			if r := est / per; r < 0.85 || r > 1.6 {
				t.Errorf("ExampleBytes %.0f, NewWorkspace allocates %.0f per example (ratio %.3f)", est, per, r)
			}
		})
	}
}

package pretrained

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/model"
)

// loraModel opens the fixture name and returns its checkpoint and its
// model with LoRA adapters on targets, with the classifier trained, over
// the checkpoint's weights.
func loraModel(t *testing.T, name string, targets []string, head string) (*Checkpoint, *model.Model) {
	t.Helper()
	ck, err := Open(fixture(t, name), Options{SeqLen: 8, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	spec, err := WithLoRA(ck.Spec(), ck.Config, 2, 4, targets)
	if err != nil {
		t.Fatal(err)
	}
	spec.Trainable = []string{head}
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	full := make([]float32, m.NumFullParams())
	if err := ck.InitFull(m, full, 7); err != nil {
		t.Fatal(err)
	}
	fm, err := m.WithFrozen(full)
	if err != nil {
		t.Fatal(err)
	}
	return ck, fm
}

// TestWithLoRATargets: PEFT's target names put adapters where PEFT does:
// BERT's query and value as parts of the fused projection, GPT-2's c_attn
// whole and c_proj in both sublayers; the adapters start with B = 0, so
// the merged model is the checkpoint's; unknown targets are one-line
// errors naming the family's.
func TestWithLoRATargets(t *testing.T) {
	ck, m := loraModel(t, "tiny-bert", nil, "classifier.*")
	var names []string
	for _, p := range m.Params() {
		names = append(names, p.Name)
	}
	want := []string{"layer.0.attention.qkv.query.lora_A", "layer.0.attention.qkv.query.lora_B",
		"layer.0.attention.qkv.value.lora_A", "layer.0.attention.qkv.value.lora_B",
		"layer.1.attention.qkv.query.lora_A", "layer.1.attention.qkv.query.lora_B",
		"layer.1.attention.qkv.value.lora_A", "layer.1.attention.qkv.value.lora_B",
		"classifier.weight", "classifier.bias"}
	if !slices.Equal(names, want) {
		t.Fatalf("trainable %v, want %v", names, want)
	}
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 0); err != nil {
		t.Fatal(err)
	}
	merged := make([]float32, ck.Model().NumParams())
	if err := m.Merged(merged, theta); err != nil {
		t.Fatal(err)
	}
	plain := make([]float32, ck.Model().NumParams())
	if err := ck.Init(plain, 7); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(merged, plain) {
		t.Fatal("with B = 0 the merged model is not the checkpoint's")
	}

	_, g := loraModel(t, "tiny-gpt2", []string{"c_attn", "c_proj"}, "score.*")
	n := 0
	for _, p := range g.Params() {
		if strings.HasSuffix(p.Name, "lora_A") {
			n++
		}
	}
	if n != 2*3 { // 2 blocks × (c_attn, attn.c_proj, mlp.c_proj)
		t.Fatalf("GPT-2: %d adapters, want 6", n)
	}
	if _, err := WithLoRA(ck.Spec(), ck.Config, 2, 4, []string{"c_attn"}); err == nil || !strings.Contains(err.Error(), "attention.output") {
		t.Fatalf("a GPT-2 target on BERT: %v", err)
	}
}

// TestExportAdapters: the adapters under PEFT's names and shapes, and
// adapter_config.json with the rank, alpha and targets.
func TestExportAdapters(t *testing.T) {
	ck, m := loraModel(t, "tiny-bert", []string{"query", "value", "intermediate"}, "classifier.*")
	theta := make([]float32, m.NumParams())
	for i := range theta {
		theta[i] = float32(i)
	}
	mp, err := NewMapping(ck.ConfigJSON, ck.Options)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := mp.ExportAdapters(dir, m, theta, nil); err != nil {
		t.Fatal(err)
	}
	ad, err := mp.Adapters(m, theta)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int{}
	for _, a := range ad {
		got[a.Name] = a.Shape
	}
	for name, shape := range map[string][]int{
		"base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight": {2, 8},
		"base_model.model.bert.encoder.layer.0.attention.self.query.lora_B.weight": {8, 2},
		"base_model.model.bert.encoder.layer.1.attention.self.value.lora_B.weight": {8, 2},
		"base_model.model.bert.encoder.layer.1.intermediate.dense.lora_A.weight":   {2, 8},
		"base_model.model.bert.encoder.layer.1.intermediate.dense.lora_B.weight":   {ck.Config.Intermediate, 2},
	} {
		if !slices.Equal(got[name], shape) {
			t.Errorf("%s: shape %v, want %v", name, got[name], shape)
		}
	}
	if len(ad) != 2*2*3 {
		t.Errorf("%d adapter tensors, want 12", len(ad))
	}
	v, _ := m.Param(theta, "layer.1.attention.qkv.value.lora_B")
	for _, a := range ad {
		if a.Name == "base_model.model.bert.encoder.layer.1.attention.self.value.lora_B.weight" && !slices.Equal(a.Data, v) {
			t.Error("value's B exported with other values")
		}
	}
	var cfg map[string]any
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, AdapterConfigFile)), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["peft_type"] != "LORA" || cfg["r"] != float64(2) || cfg["lora_alpha"] != float64(4) ||
		fmt.Sprint(cfg["target_modules"]) != "[attention.self.query attention.self.value intermediate.dense]" {
		t.Errorf("adapter config %v", cfg)
	}
	if _, err := os.Stat(filepath.Join(dir, AdapterFile)); err != nil {
		t.Error(err)
	}
}

package pretrained

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/internal/durable"
	"github.com/dpcluster/dpcluster/model"
)

// LoRA fine-tuning of a checkpoint's model. Targets are named as PEFT's
// target_modules are for the family (the last component of a module's
// name): BERT's "query", "key", "value" (parts of the engine's fused
// projection), "attention.output" (the attention's output projection),
// "intermediate" and "output" (the feed-forward's two layers); GPT-2's
// "c_attn" (the fused projection, one adapter over all of it), "c_proj"
// (the attention's and the feed-forward's output projections, as PEFT
// matches both) and "c_fc".

// AdapterFile and AdapterConfigFile are the adapters' files as PEFT's
// save_pretrained writes them.
const (
	AdapterFile       = "adapter_model.safetensors"
	AdapterConfigFile = "adapter_config.json"
)

// DefaultLoRATargets are PEFT's defaults for the family: BERT's query and
// value, GPT-2's c_attn.
func DefaultLoRATargets(f checkpoint.Family) []string {
	if f == checkpoint.GPT2 {
		return []string{"c_attn"}
	}
	return []string{"query", "value"}
}

// loraTarget is where a target puts adapters in the engine's spec: the
// nested layer named layer of every block whose name ends in block, with
// the part of its outputs (hi = 0: all of them) named part.
type loraTarget struct {
	block, layer, part string
	lo, hi             int // in units of the hidden width
}

// loraTargets are each family's targets.
var loraTargets = map[checkpoint.Family]map[string][]loraTarget{
	checkpoint.BERT: {
		"query":            {{"attention", "qkv", "query", 0, 1}},
		"key":              {{"attention", "qkv", "key", 1, 2}},
		"value":            {{"attention", "qkv", "value", 2, 3}},
		"attention.output": {{"attention", "output", "", 0, 0}},
		"intermediate":     {{"ffn", "intermediate", "", 0, 0}},
		"output":           {{"ffn", "output", "", 0, 0}},
	},
	checkpoint.GPT2: {
		"c_attn": {{"attn", "c_attn", "", 0, 0}},
		"c_proj": {{"attn", "c_proj", "", 0, 0}, {"mlp", "c_proj", "", 0, 0}},
		"c_fc":   {{"mlp", "c_fc", "", 0, 0}},
	},
}

// WithLoRA returns spec, cfg's model as SpecFor builds it, with LoRA
// adapters of rank and alpha on the targets (nil: DefaultLoRATargets) in
// every block.
func WithLoRA(spec model.Spec, cfg checkpoint.Config, rank int, alpha float64, targets []string) (model.Spec, error) {
	if len(targets) == 0 {
		targets = DefaultLoRATargets(cfg.Family)
	}
	fam := loraTargets[cfg.Family]
	var ts []loraTarget
	for _, name := range targets {
		t, ok := fam[name]
		if !ok {
			known := make([]string, 0, len(fam))
			for k := range fam {
				known = append(known, k)
			}
			sort.Strings(known)
			return spec, fmt.Errorf("pretrained: LoRA target %q is not one of %s's: %s", name, cfg.Family, strings.Join(known, ", "))
		}
		ts = append(ts, t...)
	}
	spec.Layers = slices.Clone(spec.Layers)
	found := 0
	for i := range spec.Layers {
		blk := &spec.Layers[i]
		if blk.Type != model.Residual {
			continue
		}
		blk.Layers = slices.Clone(blk.Layers)
		for j := range blk.Layers {
			nl := &blk.Layers[j]
			var parts []model.LoRAPart
			whole := false
			for _, t := range ts {
				if !strings.HasSuffix(blk.Name, t.block) || nl.Name != t.layer {
					continue
				}
				if t.hi == 0 {
					whole = true
					continue
				}
				parts = append(parts, model.LoRAPart{Name: t.part, Lo: t.lo * cfg.Hidden, Hi: t.hi * cfg.Hidden})
			}
			if !whole && len(parts) == 0 {
				continue
			}
			if whole && len(parts) > 0 {
				return spec, fmt.Errorf("pretrained: LoRA targets overlap on %s.%s", blk.Name, nl.Name)
			}
			slices.SortFunc(parts, func(a, b model.LoRAPart) int { return a.Lo - b.Lo })
			nl.LoRA = &model.LoRA{Rank: rank, Alpha: alpha, Parts: parts}
			found++
		}
	}
	if found == 0 {
		return spec, fmt.Errorf("pretrained: the LoRA targets %v match no layer", targets)
	}
	return spec, nil
}

// InitFull writes the full layout of m (m.NumFullParams values) into
// full: m is the checkpoint's model with layers frozen or LoRA adapters
// added (its MergedSpec is the checkpoint's spec). The checkpoint's
// tensors are read into the parameters they bind, as Init reads them;
// everything else, the adapters among it, is m.InitFull's from seed.
func (c *Checkpoint) InitFull(m *model.Model, full []float32, seed uint64) error {
	a, err := m.MergedSpec().CanonicalJSON()
	if err != nil {
		return err
	}
	b, err := c.plan.spec.CanonicalJSON()
	if err != nil {
		return err
	}
	if string(a) != string(b) {
		return fmt.Errorf("pretrained: the model is not the checkpoint's with adapters or frozen layers")
	}
	if err := m.InitFull(full, seed); err != nil {
		return err
	}
	at := map[string]model.ParamInfo{}
	for _, p := range m.FullParams() {
		at[p.Name] = p
	}
	return c.read(func(name string) ([]float32, bool) {
		p, ok := at[name]
		if !ok {
			return nil, false
		}
		return full[p.Offset : p.Offset+p.Size], true
	})
}

// Adapter is one LoRA adapter tensor under PEFT's name.
type Adapter = Tensor

// Adapters returns the LoRA adapters of m (the checkpoint's model with
// adapters) in theta under the names PEFT's save_pretrained gives them
// ("base_model.model.<module>.lora_A.weight" [r, in] and "…lora_B.weight"
// [out, r]), GPT-2's Conv1D modules included (PEFT's fan_in_fan_out
// changes only how it merges them). The Data slices are copies.
func (mp *Mapping) Adapters(m *model.Model, theta []float32) ([]Adapter, error) {
	mods := map[string][]string{} // engine layer ↦ its checkpoint modules, from the bindings
	for _, b := range mp.plan.bindings {
		if eng, ok := strings.CutSuffix(b.param, ".weight"); ok {
			for _, part := range b.parts {
				mods[eng] = append(mods[eng], strings.TrimSuffix(part, ".weight"))
			}
		}
	}
	var out []Adapter
	for _, p := range m.Params() {
		cut := strings.LastIndex(p.Name, ".lora_")
		if cut < 0 {
			continue
		}
		prefix, which := p.Name[:cut], p.Name[cut+1:]
		name := ""
		if ms := mods[prefix]; len(ms) == 1 {
			name = ms[0] // an adapter over the whole layer
		} else if i := strings.LastIndex(prefix, "."); i > 0 {
			for _, mod := range mods[prefix[:i]] { // a part of a fused layer: query, key or value
				if strings.HasSuffix(mod, "."+prefix[i+1:]) {
					name = mod
				}
			}
		}
		if name == "" {
			return nil, fmt.Errorf("pretrained: adapter %s has no checkpoint module (a bug in the mapping)", p.Name)
		}
		v, _ := m.Param(theta, p.Name)
		out = append(out, Adapter{Name: "base_model.model." + name + "." + which + ".weight", Shape: slices.Clone(p.Shape), Data: slices.Clone(v)})
	}
	slices.SortFunc(out, func(a, b Adapter) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ExportAdapters writes the adapters of m in theta into dir as PEFT's
// save_pretrained does: AdapterFile (Adapters) and AdapterConfigFile
// (peft_type LORA, r and lora_alpha of m's first adapted layer, the
// adapted modules' names below their block as target_modules,
// fan_in_fan_out for GPT-2's Conv1D). The checkpoint's weights are not in
// it: a PEFT user loads them from the checkpoint the run started from.
func (mp *Mapping) ExportAdapters(dir string, m *model.Model, theta []float32, meta map[string]string) error {
	ad, err := mp.Adapters(m, theta)
	if err != nil {
		return err
	}
	lr := firstLoRA(m.Spec().Layers)
	if lr == nil {
		return fmt.Errorf("pretrained: the model has no LoRA adapters")
	}
	var targets []string
	for _, a := range ad {
		mod := strings.TrimPrefix(a.Name, "base_model.model.")
		mod = mod[:strings.LastIndex(mod, ".lora_")]
		// Below the block: "attention.self.query", "attn.c_attn".
		for _, blk := range []string{".layer.", ".h."} {
			if i := strings.Index(mod, blk); i >= 0 {
				rest := mod[i+len(blk):]
				if j := strings.Index(rest, "."); j >= 0 {
					mod = rest[j+1:]
				}
				break
			}
		}
		if !slices.Contains(targets, mod) {
			targets = append(targets, mod)
		}
	}
	cfg := map[string]any{
		"peft_type": "LORA", "task_type": "SEQ_CLS", "r": lr.Rank, "lora_alpha": lr.Alpha, "lora_dropout": 0.0,
		"target_modules": targets, "fan_in_fan_out": mp.Config.Family == checkpoint.GPT2, "bias": "none",
		"inference_mode": true,
	}
	js, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := durable.Replace(filepath.Join(dir, AdapterFile), 0o644, func(f *os.File) error {
		return WriteSafetensors(f, ad, meta)
	}); err != nil {
		return fmt.Errorf("pretrained: writing %s: %w", AdapterFile, err)
	}
	return durable.Replace(filepath.Join(dir, AdapterConfigFile), 0o644, func(f *os.File) error {
		_, err := f.Write(append(js, '\n'))
		return err
	})
}

// firstLoRA returns the first adapted layer's LoRA in layers, nested ones
// included, or nil.
func firstLoRA(layers []model.LayerSpec) *model.LoRA {
	for _, l := range layers {
		if l.LoRA != nil {
			return l.LoRA
		}
		if lr := firstLoRA(l.Layers); lr != nil {
			return lr
		}
	}
	return nil
}

// HasLoRA reports whether spec adapts some layer with LoRA.
func HasLoRA(spec model.Spec) bool { return firstLoRA(spec.Layers) != nil }

package cli

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/pretrained"
	"github.com/dpcluster/dpcluster/raftlog"
)

// TestLocalFrozenLayers fine-tunes only the classifier of a checkpoint
// through the command: the run's parameter vector, the Raft log's step
// entries and the snapshots hold the trainable parameters only (each is
// smaller than one copy of the whole model could be), the frozen tensors
// of the fine-tuned model are the checkpoint's bit for bit, the
// classifier moved, and export rebuilds the same whole model from the
// checkpoint.
func TestLocalFrozenLayers(t *testing.T) {
	ckpt := tinyCheckpoint(t, "tiny-bert")
	data := t.TempDir()
	res := localJSON(t, []string{"local", "--init-from", ckpt, "--dataset", "fortunes-category", "--data", fortuneDir(t),
		"--seq-len", "8", "--batch-size", "20", "--max-steps", "12", "--target-epsilon", "8", "--lr", "0.05",
		"--trainable", "classifier.*,pooler.*",
		"--eval-every", "0", "--round-timeout", "20s", "--data-dir", data, "--progress", "off"})
	if res["steps"] != float64(12) {
		t.Fatalf("%v steps", res["steps"])
	}

	c, err := coordinator.ReadCommitted(data, initFunc(ckpt, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := pretrained.Open(ckpt, pretrained.Options{SeqLen: 8, Classes: 2})
	if err != nil {
		t.Fatal(err)
	}
	full := ck.Model().NumParams()
	ck.Close()
	spec, err := model.ParseSpec(c.Config.ModelSpec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	trainable := 0
	for _, p := range m.Params() {
		if !strings.HasPrefix(p.Name, "classifier.") && !strings.HasPrefix(p.Name, "pooler.") {
			t.Errorf("%s trains", p.Name)
		}
		trainable += p.Size
	}
	if c.Config.Dim != trainable || len(c.Theta) != trainable || trainable*10 > full {
		t.Fatalf("run dimension %d, θ %d values; %d parameters train of %d", c.Config.Dim, len(c.Theta), trainable, full)
	}

	// The Raft log (the entries a finished run keeps: the last step's
	// charge and its g̃): the g̃ entry holds a vector of the trainable
	// dimension, and no entry could hold the whole model's.
	logs, err := raftlog.OpenReadOnly(filepath.Join(data, "raft"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	first, _ := logs.FirstIndex()
	last, _ := logs.LastIndex()
	largest := 0
	for i := first; i <= last; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type == raft.LogCommand {
			largest = max(largest, len(l.Data))
		}
	}
	if largest < 4*trainable || largest >= 4*full {
		t.Fatalf("largest log entry %d bytes: want at least the %d bytes of the trainable vector and under the %d of the whole model",
			largest, 4*trainable, 4*full)
	}

	// Snapshots: θ and the optimizer's state of the trainable dimension
	// (the body also holds the ledger's records, which do not grow with
	// the model).
	snaps, err := raftlog.ReadSnapshots(data)
	if err != nil {
		t.Fatal(err)
	}
	metas, err := snaps.List()
	if err != nil || len(metas) == 0 {
		t.Fatalf("no snapshot: %v", err)
	}
	for _, meta := range metas {
		_, rc, err := snaps.Open(meta.ID)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Body struct {
				Theta     []byte `msgpack:"theta"`
				Optimizer []byte `msgpack:"optimizer"`
			} `msgpack:"body"`
		}
		if len(b) < 20 || msgpack.Unmarshal(b[16:len(b)-4], &file) != nil {
			t.Fatalf("snapshot %s does not decode", meta.ID)
		}
		body := file.Body
		if len(body.Theta) != 4*trainable || len(body.Optimizer) < 2*4*trainable || len(body.Optimizer) >= 4*full {
			t.Errorf("snapshot %s: θ %d bytes, optimizer state %d: want θ of %d and the state of two moments of the trainable dimension, under the %d bytes of one whole θ",
				meta.ID, len(body.Theta), len(body.Optimizer), 4*trainable, 4*full)
		}
	}

	// The fine-tuned model is whole: the frozen tensors are the
	// checkpoint's, bit for bit; the head moved.
	before := readTensors(t, filepath.Join(ckpt, pretrained.WeightsFile))
	fine := filepath.Join(data, FinetunedDir)
	after := readTensors(t, filepath.Join(fine, pretrained.WeightsFile))
	moved, frozen := 0, 0
	for name, w := range after {
		v, ok := before[name]
		switch {
		case !ok:
			if !strings.HasPrefix(name, "classifier.") {
				t.Errorf("the fine-tuned model has %s, which the checkpoint has not", name)
			}
		case strings.HasPrefix(name, "bert.pooler.") || strings.HasPrefix(name, "classifier."):
			if !slices.Equal(v, w) {
				moved++
			}
		case !slices.Equal(v, w):
			t.Errorf("frozen %s changed", name)
		default:
			frozen++
		}
	}
	if frozen < 10 {
		t.Errorf("%d frozen tensors compared", frozen)
	}
	if moved == 0 {
		t.Error("neither the pooler nor the classifier moved")
	}

	// export merges the frozen layers from the checkpoint; without it, it
	// cannot.
	out := filepath.Join(t.TempDir(), "export")
	if _, _, err := runCmd(t, "export", data, "--out", out); err == nil || !strings.Contains(err.Error(), "--init-from") {
		t.Errorf("export without the checkpoint: %v", err)
	}
	if _, _, err := runCmd(t, "export", data, "--out", out, "--init-from", ckpt); err != nil {
		t.Fatal(err)
	}
	exported := readTensors(t, filepath.Join(out, pretrained.WeightsFile))
	for name, v := range after {
		if !slices.Equal(exported[name], v) {
			t.Errorf("%s: export differs from the run's fine-tuned model", name)
		}
	}
	plain := filepath.Join(t.TempDir(), "model.safetensors")
	if _, _, err := runCmd(t, "export", data, "--out", plain, "--format", "safetensors", "--init-from", ckpt); err != nil {
		t.Fatal(err)
	}
	if got := readTensors(t, plain); len(got) != len(ck.Model().Params()) {
		t.Errorf("safetensors export: %d tensors, the whole model has %d", len(got), len(ck.Model().Params()))
	}
}

// TestFrozenFlagsRefused: --trainable without a checkpoint, and patterns
// that do not fit the checkpoint's parameters, are one-line errors before
// any data loads.
func TestFrozenFlagsRefused(t *testing.T) {
	ckpt := tinyCheckpoint(t, "tiny-bert")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--trainable", "classifier.*"}, "--init-from"},
		{[]string{"--init-from", ckpt, "--trainable", "head.*"}, "matches no parameter"},
		{[]string{"--init-from", ckpt, "--trainable", "*.bias"}, "split a layer"},
		{[]string{"--init-from", ckpt, "--freeze", "*"}, "no parameter to train"},
	} {
		args := append([]string{"local", "--dataset", "fortunes-category", "--data", "/nonexistent", "--max-steps", "1",
			"--data-dir", t.TempDir(), "--progress", "off"}, tc.args...)
		if _, _, err := runCmd(t, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestLocalLoRA fine-tunes a checkpoint with LoRA adapters on the query
// and value and the classifier trained: the run's vector is the adapters
// and the head; the fine-tuned folder holds the checkpoint's model with
// each adapter folded into its weight (W + (α/r)·B A, checked against the
// adapters written beside it under PEFT's names), every other tensor but
// the head bit-identical to the checkpoint's.
func TestLocalLoRA(t *testing.T) {
	ckpt := tinyCheckpoint(t, "tiny-bert")
	data := t.TempDir()
	res := localJSON(t, []string{"local", "--init-from", ckpt, "--dataset", "fortunes-category", "--data", fortuneDir(t),
		"--seq-len", "8", "--batch-size", "20", "--max-steps", "10", "--target-epsilon", "8", "--lr", "0.05",
		"--lora-rank", "2", "--lora-alpha", "4", "--trainable", "classifier.*",
		"--eval-every", "0", "--round-timeout", "20s", "--data-dir", data, "--progress", "off"})
	if res["steps"] != float64(10) {
		t.Fatalf("%v steps", res["steps"])
	}
	c, err := coordinator.ReadCommitted(data, initFunc(ckpt, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	const H, r = 8, 2
	// 2 blocks × 2 parts × (A [r, H] + B [H, r]) + classifier [2, H] + [2].
	if want := 2*2*(r*H+H*r) + 2*H + 2; c.Config.Dim != want || len(c.Theta) != want {
		t.Fatalf("run dimension %d, θ %d values, want %d", c.Config.Dim, len(c.Theta), want)
	}
	fine := filepath.Join(data, FinetunedDir)
	before := readTensors(t, filepath.Join(ckpt, pretrained.WeightsFile))
	after := readTensors(t, filepath.Join(fine, pretrained.WeightsFile))
	adapters := readTensors(t, filepath.Join(fine, pretrained.AdapterFile))
	if len(adapters) != 8 {
		t.Fatalf("%d adapter tensors, want 8", len(adapters))
	}
	for name, w := range after {
		v, ok := before[name]
		if !ok {
			continue // the new classifier
		}
		mod := strings.TrimSuffix(name, ".weight")
		a, adapted := adapters["base_model.model."+mod+".lora_A.weight"]
		if !adapted {
			if !slices.Equal(v, w) && !strings.HasPrefix(name, "classifier.") {
				t.Errorf("%s changed, and has no adapter", name)
			}
			continue
		}
		b := adapters["base_model.model."+mod+".lora_B.weight"]
		moved := false
		for o := range H {
			for i := range H {
				want := float64(v[o*H+i])
				for k := range r {
					want += 4.0 / r * float64(b[o*r+k]) * float64(a[k*H+i])
				}
				if d := float64(w[o*H+i]) - want; d*d > 1e-10*(1+want*want) {
					t.Fatalf("%s[%d, %d] = %v, W + (α/r)·BA = %v", name, o, i, w[o*H+i], want)
				}
				moved = moved || w[o*H+i] != v[o*H+i]
			}
		}
		if !moved {
			t.Errorf("%s: the adapters did not move", name)
		}
	}
	if _, err := os.Stat(filepath.Join(fine, pretrained.AdapterConfigFile)); err != nil {
		t.Error(err)
	}
	// export from the data dir writes the same.
	out := filepath.Join(t.TempDir(), "export")
	if _, _, err := runCmd(t, "export", data, "--out", out, "--init-from", ckpt); err != nil {
		t.Fatal(err)
	}
	for name, v := range readTensors(t, filepath.Join(out, pretrained.AdapterFile)) {
		if !slices.Equal(adapters[name], v) {
			t.Errorf("export's %s differs", name)
		}
	}
}

package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/internal/durable"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/pretrained"
	"github.com/dpcluster/dpcluster/seed"
)

// ModelFile is the file local, and a replica whose run finished, write
// into the data dir: θ at the last step, in safetensors (exportModel).
const ModelFile = "model.safetensors"

func newExportCmd() *cobra.Command {
	var out, format, initFrom string
	cmd := &cobra.Command{
		Use:   "export DATA_DIR --out FILE",
		Short: "Write the trained model (θ at the last committed step) from a replica's data dir",
		Long: `export reads a coordinator replica's data directory offline and writes θ at the last
step the replica committed as a safetensors file with PyTorch names and layouts: <layer>.weight
([out, in] for linear layers, [out, in, kh, kw] for conv), <layer>.bias. The header's
__metadata__ holds the model spec as JSON (key "spec"), the run, the step, ε spent, δ, the target
ε, the accountant and privacy event, and whether the run was private ("true" unless it ran with
--insecure-seed), all as strings; where the training data named them, the class names
("classes") and feature columns ("features"), as JSON arrays, and the label and text columns.

It is read-only and safe while the replica runs: it opens nothing in DATA_DIR for writing, takes
no lock there and starts no Raft. "Committed" is read from the ledger (hashicorp/raft does not
persist its commit index): θ is the newest snapshot's with the log entries up to the ledger's
last charge replayed through the replica's own state machine, that is θ at the last step this
replica applied.

Inputs are preprocessed as the training data was: Fashion-MNIST pixels are divided by 255
(float32 in [0, 1], [1, 28, 28] in C, H, W order), CSV features are used as given.
coordinator predict classifies a data file with it; the Python package in python/ (numpy, and
PyTorch if present) loads it outside dpcluster.

A run fine-tuned from a pretrained checkpoint (--init-from) is written back in the checkpoint's
own format (--format pretrained, its default): --out is a folder that receives config.json
(the checkpoint's, with architectures and num_labels set) and model.safetensors with the
checkpoint's tensor names and layouts, which Hugging Face transformers' from_pretrained loads
(BertForSequenceClassification, GPT2ForSequenceClassification). When the replica has no
snapshot yet, θ is rebuilt from θ₀, the checkpoint's weights: give its folder with --init-from.
A checkpoint given must hash to what the run recorded.`,
		Example: `  coordinator export /tmp/run1 --out model.safetensors`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "" && format != "safetensors" && format != "pretrained" {
				return fmt.Errorf("--format %q: safetensors or pretrained", format)
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			c, err := exportModel(args[0], out, format, initFrom)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: run %s, step %d, ε = %.4f at δ = %g%s\n",
				out, c.Config.Run, c.Step, c.Epsilon, c.Config.Delta, privateNote(c.Config))
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write (replaced atomically)")
	cmd.Flags().StringVar(&format, "format", "", "output format: safetensors (one file, the engine's tensor names; the default) or pretrained (a folder in the format of the checkpoint the run started from; the default for such a run)")
	cmd.Flags().StringVar(&initFrom, "init-from", "", "the pretrained checkpoint's folder, for a run that started from one (θ₀ is rebuilt from it)")
	return cmd
}

func privateNote(c coordinator.RunConfig) string {
	if c.SeedPolicy == seed.Crypto {
		return ""
	}
	return " (seeded noise: NOT differentially private)"
}

// exportModel reads the replica data dir dataDir offline
// (coordinator.ReadCommitted, with the replicas' own θ₀) and writes θ at
// its last committed step to out in safetensors (model.WriteSafetensors),
// with the run's public description as metadata. out is replaced
// atomically: written to a temporary file beside it, fsynced, renamed.
// Nothing in dataDir is written unless out is there.
func exportModel(dataDir, out, format, initFrom string) (coordinator.Committed, error) {
	c, err := coordinator.ReadCommitted(dataDir, initFunc(initFrom, nil, nil))
	if err != nil {
		return c, fmt.Errorf("export %s: %w", dataDir, err)
	}
	if initFrom != "" && c.Config.Pretrained != nil {
		// θ₀ may not have been needed (θ came from a snapshot): a
		// checkpoint given is checked all the same.
		if err := checkWeights(initFrom, c.Config); err != nil {
			return c, fmt.Errorf("export %s: %w", dataDir, err)
		}
	}
	theta := c.Theta
	c, fm, err := mergeFrozen(c, initFrom, nil)
	if err != nil {
		return c, fmt.Errorf("export %s: %w", dataDir, err)
	}
	if format == "pretrained" || (format == "" && c.Config.Pretrained != nil) {
		if err := writePretrained(c, out); err != nil {
			return c, err
		}
		return c, writeAdapters(c, fm, theta, out)
	}
	return c, writeModel(c, out)
}

// mergeFrozen returns c as the whole model if its run trains only part
// of it: θ as the checkpoint's plain model (model.Model.Merged: the
// frozen values merged in, LoRA adapters folded into their weights), the
// spec without patterns or adapters and that model's hash, which is what
// an export writes; and the run's own model, whose adapters (if any)
// are exported beside it. The frozen values are have's, the process's
// own model, when it is the run's; else the checkpoint in initFrom's. A
// run that trains its whole model is returned as it is, with a nil model.
func mergeFrozen(c coordinator.Committed, initFrom string, have *model.Model) (coordinator.Committed, *model.Model, error) {
	spec, err := model.ParseSpec(c.Config.ModelSpec)
	if err != nil {
		return c, nil, fmt.Errorf("the run's model spec: %w", err)
	}
	if !freezes(spec) {
		return c, nil, nil
	}
	m := have
	if m == nil || m.Hash() != c.Config.ModelHash {
		if c.Config.Pretrained == nil || initFrom == "" {
			return c, nil, fmt.Errorf("run %s trains only part of its model: %w (the frozen layers are its weights)", c.Config.Run, errNeedsInitFrom)
		}
		ck, err := openRunCheckpoint(initFrom, c.Config, spec)
		if err != nil {
			return c, nil, err
		}
		defer ck.Close()
		if m, err = frozenModel(ck, spec, c.Config.InitSeed); err != nil {
			return c, nil, err
		}
		if m.Hash() != c.Config.ModelHash {
			return c, nil, fmt.Errorf("--init-from %s builds model %s, the run's is %s", initFrom, m.Hash(), c.Config.ModelHash)
		}
	}
	plain := m.MergedSpec()
	pm, err := model.New(plain)
	if err != nil {
		return c, nil, err
	}
	full := make([]float32, pm.NumParams())
	if err := m.Merged(full, c.Theta); err != nil {
		return c, nil, err
	}
	js, err := plain.CanonicalJSON()
	if err != nil {
		return c, nil, err
	}
	c.Theta, c.Config.ModelSpec, c.Config.ModelHash, c.Config.Dim = full, js, pm.Hash(), len(full)
	return c, m, nil
}

// writeAdapters writes the LoRA adapters of the run's model m (θ of the
// run, theta) beside the fine-tuned model in dir, as PEFT saves them;
// nothing for a model without adapters.
func writeAdapters(c coordinator.Committed, m *model.Model, theta []float32, dir string) error {
	if m == nil || !pretrained.HasLoRA(m.Spec()) || c.Config.Pretrained == nil {
		return nil
	}
	spec := m.MergedSpec()
	mp, err := pretrained.NewMapping(c.Config.Pretrained.Config, pretrained.Options{SeqLen: spec.Input[0], Classes: spec.Classes, SepID: sepOf(spec)})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	meta, err := exportMeta(c)
	if err != nil {
		return err
	}
	if err := mp.ExportAdapters(dir, m, theta, meta); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// writePretrained writes θ of c, a run started from a pretrained
// checkpoint, into the folder out in the checkpoint's format
// (pretrained.Mapping.Export), with the run's public description as the
// weights file's metadata.
func writePretrained(c coordinator.Committed, out string) error {
	if c.Config.Pretrained == nil {
		return fmt.Errorf("export --format pretrained: run %s did not start from a pretrained checkpoint", c.Config.Run)
	}
	spec, err := model.ParseSpec(c.Config.ModelSpec)
	if err != nil {
		return fmt.Errorf("export: the run's model spec: %w", err)
	}
	mp, err := pretrained.NewMapping(c.Config.Pretrained.Config, pretrained.Options{SeqLen: spec.Input[0], Classes: spec.Classes, SepID: sepOf(spec)})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if mp.Model().Hash() != c.Config.ModelHash {
		return fmt.Errorf("export: the checkpoint's config.json builds model %s, the run's is %s", mp.Model().Hash(), c.Config.ModelHash)
	}
	meta, err := exportMeta(c)
	if err != nil {
		return err
	}
	if err := mp.Export(out, c.Theta, nil, meta); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// FinetunedDir is the folder local, and a replica whose run finished,
// write into the data dir for a run started from a pretrained checkpoint:
// θ in the checkpoint's own format (writePretrained).
const FinetunedDir = "finetuned"

// writeFinetuned writes c, if its run started from a pretrained
// checkpoint, into dataDir/FinetunedDir and returns that folder ("" for
// any other run).
func writeFinetuned(c coordinator.Committed, dataDir string) (string, error) {
	if c.Config.Pretrained == nil {
		return "", nil
	}
	dir := filepath.Join(dataDir, FinetunedDir)
	return dir, writePretrained(c, dir)
}

// finetunedLine is the line saying where writeFinetuned wrote.
func finetunedLine(dir string, step int64) string {
	return fmt.Sprintf("fine-tuned model: %s (θ at step %d in the checkpoint's format: config.json, model.safetensors)", dir, step)
}

// sepOf returns the [SEP] id a model spec reads token types from
// (model.LayerSpec.TypeSep of its first layer), or -1.
func sepOf(spec model.Spec) int {
	if len(spec.Layers) > 0 && spec.Layers[0].TypeSep != nil {
		return *spec.Layers[0].TypeSep
	}
	return -1
}

// writeModel writes θ of c to out as exportModel describes.
func writeModel(c coordinator.Committed, out string) error {
	spec, err := model.ParseSpec(c.Config.ModelSpec)
	if err != nil {
		return fmt.Errorf("export: the run's model spec: %w", err)
	}
	m, err := model.New(spec)
	if err != nil {
		return err
	}
	meta, err := exportMeta(c)
	if err != nil {
		return err
	}
	meta["spec"] = string(c.Config.ModelSpec)
	err = durable.Replace(out, 0o600, func(f *os.File) error {
		return m.WriteSafetensors(f, c.Theta, meta)
	})
	if err != nil {
		return fmt.Errorf("export: writing %s: %w", out, err)
	}
	return nil
}

// exportMeta is the run's public description an exported model's
// safetensors header carries; with the run's names (RunConfig.Names) also
// "classes" and "features" (JSON arrays of strings, the class names in
// class order and the feature columns in input order) and
// "label_column", "text_column" and "text_pair_column".
func exportMeta(c coordinator.Committed) (map[string]string, error) {
	event, err := json.Marshal(c.Config.Event())
	if err != nil {
		return nil, err
	}
	meta := map[string]string{
		"run":            c.Config.Run,
		"step":           strconv.FormatInt(c.Step, 10),
		"epsilon":        strconv.FormatFloat(c.Epsilon, 'g', -1, 64),
		"delta":          strconv.FormatFloat(c.Config.Delta, 'g', -1, 64),
		"target_epsilon": strconv.FormatFloat(c.Config.TargetEpsilon, 'g', -1, 64),
		"accountant":     c.Config.AccountantName(),
		"privacy_event":  string(event),
		"noise_mode":     c.Config.NoiseMode,
		"private":        strconv.FormatBool(c.Config.SeedPolicy == seed.Crypto),
		"state_sha256":   c.Digest,
	}
	if n := c.Config.Names; n != nil {
		for k, v := range map[string][]string{"classes": n.Classes, "features": n.Features} {
			if v == nil {
				continue
			}
			b, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			meta[k] = string(b)
		}
		for k, v := range map[string]string{"label_column": n.LabelColumn, "text_column": n.TextColumn, "text_pair_column": n.TextPairColumn} {
			if v != "" {
				meta[k] = v
			}
		}
	}
	return meta, nil
}

package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/internal/durable"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/seed"
)

// ModelFile is the file local, and a replica whose run finished, write
// into the data dir: θ at the last step, in safetensors (exportModel).
const ModelFile = "model.safetensors"

func newExportCmd() *cobra.Command {
	var out, format string
	cmd := &cobra.Command{
		Use:   "export DATA_DIR --out FILE",
		Short: "Write the trained model (θ at the last committed step) from a replica's data dir",
		Long: `export reads a coordinator replica's data directory offline and writes θ at the last
step the replica committed as a safetensors file with PyTorch names and layouts: <layer>.weight
([out, in] for linear layers, [out, in, kh, kw] for conv), <layer>.bias. The header's
__metadata__ holds the model spec as JSON (key "spec"), the run, the step, ε spent, δ, the target
ε, the accountant and privacy event, and whether the run was private ("true" unless it ran with
--insecure-seed), all as strings.

It is read-only and safe while the replica runs: it opens nothing in DATA_DIR for writing, takes
no lock there and starts no Raft. "Committed" is read from the ledger (hashicorp/raft does not
persist its commit index): θ is the newest snapshot's with the log entries up to the ledger's
last charge replayed through the replica's own state machine, that is θ at the last step this
replica applied.

Inputs are preprocessed as the training data was: Fashion-MNIST pixels are divided by 255
(float32 in [0, 1], [1, 28, 28] in C, H, W order), CSV features are used as given.
examples/safetensors_classify.py shows the model used from Python with numpy only.`,
		Example: `  coordinator export /tmp/run1 --out model.safetensors`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "safetensors" {
				return fmt.Errorf("--format %q: only safetensors is supported", format)
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			c, err := exportModel(args[0], out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: run %s, step %d, ε = %.4f at δ = %g%s\n",
				out, c.Config.Run, c.Step, c.Epsilon, c.Config.Delta, privateNote(c.Config))
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write (replaced atomically)")
	cmd.Flags().StringVar(&format, "format", "safetensors", "output format: safetensors")
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
func exportModel(dataDir, out string) (coordinator.Committed, error) {
	c, err := coordinator.ReadCommitted(dataDir, modelInit)
	if err != nil {
		return c, fmt.Errorf("export %s: %w", dataDir, err)
	}
	return c, writeModel(c, out)
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
	event, err := json.Marshal(c.Config.Event())
	if err != nil {
		return err
	}
	meta := map[string]string{
		"spec":           string(c.Config.ModelSpec),
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
	err = durable.Replace(out, 0o600, func(f *os.File) error {
		return m.WriteSafetensors(f, c.Theta, meta)
	})
	if err != nil {
		return fmt.Errorf("export: writing %s: %w", out, err)
	}
	return nil
}

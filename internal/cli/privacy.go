package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/ledger"
)

// orderSet maps the --orders flag to Rényi orders.
func orderSet(name string) ([]float64, error) {
	switch name {
	case "default":
		return ledger.DefaultOrders(), nil
	case "opacus":
		return ledger.OpacusOrders(), nil
	}
	return nil, fmt.Errorf("--orders must be default or opacus, not %q", name)
}

type privacyFlags struct {
	sampleRate float64
	sigma      float64
	steps      int64
	delta      float64
	target     float64
	orders     string
	json       bool
}

func (f *privacyFlags) common(cmd *cobra.Command) {
	cmd.Flags().Float64Var(&f.sampleRate, "sample-rate", 0, "Poisson sampling rate q = B/N, in (0, 1] (required)")
	cmd.Flags().Int64Var(&f.steps, "steps", 0, "number of training steps, at least 1 (required)")
	cmd.Flags().Float64Var(&f.delta, "delta", 1e-5, "δ, in (0, 1)")
	cmd.Flags().StringVar(&f.orders, "orders", "default", "Rényi orders: default (a superset of Opacus's) or opacus")
	cmd.Flags().BoolVar(&f.json, "json", false, "print machine-readable JSON with the inputs echoed")
	_ = cmd.MarkFlagRequired("sample-rate")
	_ = cmd.MarkFlagRequired("steps")
}

func newPrivacyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "privacy",
		Short: "Privacy accounting for the Poisson-subsampled Gaussian mechanism (RDP)",
		Long: `Privacy accounting with the Rényi DP accountant of Mironov, Talwar and Zhang (2019),
converted to (ε, δ) with Balle et al. (2020), Thm. 21, as Opacus and dp_accounting do.`,
	}
	cmd.AddCommand(newEpsilonCmd(), newSigmaCmd())
	return cmd
}

// epsilonResult is the --json output of privacy epsilon.
type epsilonResult struct {
	SampleRate      float64 `json:"sample_rate"`
	NoiseMultiplier float64 `json:"noise_multiplier"`
	Steps           int64   `json:"steps"`
	Delta           float64 `json:"delta"`
	Orders          string  `json:"orders"`
	Epsilon         float64 `json:"epsilon"`
	Order           float64 `json:"optimal_order"`
	Accountant      string  `json:"accountant"`
}

func newEpsilonCmd() *cobra.Command {
	var f privacyFlags
	cmd := &cobra.Command{
		Use:   "epsilon",
		Short: "Print the ε spent by a DP-SGD style run",
		Example: `  coordinator privacy epsilon --sample-rate 0.004266666666666667 \
      --noise-multiplier 1.1 --steps 14062 --delta 1e-5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			orders, err := orderSet(f.orders)
			if err != nil {
				return err
			}
			eps, order, err := ledger.EpsilonOrders(orders, f.sampleRate, f.sigma, f.steps, f.delta)
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), epsilonResult{
					SampleRate: f.sampleRate, NoiseMultiplier: f.sigma, Steps: f.steps, Delta: f.delta,
					Orders: f.orders, Epsilon: eps, Order: order, Accountant: "rdp",
				})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "ε = %.4f at δ = %g (best Rényi order α = %g; q = %g, σ = %g, %d steps)\n",
				eps, f.delta, order, f.sampleRate, f.sigma, f.steps)
			return err
		},
	}
	f.common(cmd)
	cmd.Flags().Float64Var(&f.sigma, "noise-multiplier", 0, "noise multiplier σ (noise std over clip norm), > 0 (required)")
	_ = cmd.MarkFlagRequired("noise-multiplier")
	return cmd
}

// sigmaResult is the --json output of privacy sigma.
type sigmaResult struct {
	TargetEpsilon   float64 `json:"target_epsilon"`
	SampleRate      float64 `json:"sample_rate"`
	Steps           int64   `json:"steps"`
	Delta           float64 `json:"delta"`
	Orders          string  `json:"orders"`
	NoiseMultiplier float64 `json:"noise_multiplier"`
	Epsilon         float64 `json:"epsilon"`
	Order           float64 `json:"optimal_order"`
	Accountant      string  `json:"accountant"`
}

func newSigmaCmd() *cobra.Command {
	var f privacyFlags
	cmd := &cobra.Command{
		Use:   "sigma",
		Short: "Print the smallest noise multiplier σ that keeps ε within a target",
		Example: `  coordinator privacy sigma --target-epsilon 3 --sample-rate 0.004266666666666667 \
      --steps 2343 --delta 1e-5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			orders, err := orderSet(f.orders)
			if err != nil {
				return err
			}
			sigma, err := ledger.CalibrateSigma(orders, f.target, f.sampleRate, f.steps, f.delta)
			if err != nil {
				return err
			}
			eps, order, err := ledger.EpsilonOrders(orders, f.sampleRate, sigma, f.steps, f.delta)
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), sigmaResult{
					TargetEpsilon: f.target, SampleRate: f.sampleRate, Steps: f.steps, Delta: f.delta,
					Orders: f.orders, NoiseMultiplier: sigma, Epsilon: eps, Order: order, Accountant: "rdp",
				})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "σ = %.6f gives ε = %.4f ≤ %g at δ = %g (best Rényi order α = %g; q = %g, %d steps)\n",
				sigma, eps, f.target, f.delta, order, f.sampleRate, f.steps)
			return err
		},
	}
	f.common(cmd)
	cmd.Flags().Float64Var(&f.target, "target-epsilon", 0, "target ε, > 0 (required)")
	_ = cmd.MarkFlagRequired("target-epsilon")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/coordinator"
)

// orderSet maps the --orders flag to the RDP accountant's Rényi orders.
func orderSet(name string) (accounting.RDP, error) {
	switch name {
	case "default":
		return accounting.RDP{}, nil
	case "opacus":
		return accounting.NewRDP(accounting.OpacusOrders())
	}
	return accounting.RDP{}, fmt.Errorf("--orders must be default or opacus, not %q", name)
}

type privacyFlags struct {
	sampleRate float64
	sigma      float64
	steps      int64
	delta      float64
	target     float64
	orders     string
	// accountantName is --accountant: accountantRDP or accountantPLD.
	accountantName string
	mechanism      string
	dim            int
	clip           float64
	json           bool
}

// The accountants and mechanisms of privacy epsilon|sigma.
const (
	accountantRDP = string(accounting.NameRDP)
	accountantPLD = string(accounting.NamePLD)

	mechGaussian         = "gaussian"
	mechDiscreteGaussian = "discrete-gaussian"
)

// check validates --accountant, --mechanism and the lattice flags together:
// the PLD accountant charges the discrete Gaussian only with the leader's
// lattice, which --dim (and --clip) determine.
func (f *privacyFlags) check() error {
	switch f.accountantName {
	case accountantRDP, accountantPLD:
	default:
		return fmt.Errorf("--accountant must be %s or %s, not %q", accountantRDP, accountantPLD, f.accountantName)
	}
	switch f.mechanism {
	case mechGaussian, mechDiscreteGaussian:
	default:
		return fmt.Errorf("--mechanism must be %s or %s, not %q", mechGaussian, mechDiscreteGaussian, f.mechanism)
	}
	switch {
	case f.dim < 0:
		return fmt.Errorf("--dim %d must not be negative", f.dim)
	case f.dim > 0 && f.mechanism != mechDiscreteGaussian:
		return fmt.Errorf("--dim is for --mechanism %s only", mechDiscreteGaussian)
	case f.accountantName == accountantPLD && f.mechanism == mechDiscreteGaussian && f.dim == 0:
		return fmt.Errorf("--accountant pld charges --mechanism %s with the leader's lattice: give --dim (the model's parameter count) and --clip", mechDiscreteGaussian)
	case !(f.clip > 0) || math.IsInf(f.clip, 0):
		return fmt.Errorf("--clip %v must be positive and finite", f.clip)
	}
	return nil
}

// event returns the ledger event of one step of the flags' mechanism.
// With --dim, the discrete Gaussian is the leader's (mechanism.
// DiscreteGaussian for σ, --clip and --dim): σ is the run's noise
// multiplier and the event is the one the run charges (its σ_eff, with the
// lattice for PLD: coordinator.RunConfig.Event); so is the Gaussian's.
// Without --dim, σ is the discrete Gaussian's noise multiplier itself. An
// impossible lattice gives the zero Event, which accounting refuses.
func (f *privacyFlags) event(sigma float64) accounting.Event {
	if f.mechanism == mechDiscreteGaussian && f.dim == 0 {
		return accounting.PoissonSampled(f.sampleRate, accounting.DiscreteGaussian(sigma))
	}
	return f.run(sigma).Event()
}

// run is the part of a run's configuration that decides the event each
// of its steps charges (coordinator.RunConfig.Event), from the flags and σ.
func (f *privacyFlags) run(sigma float64) coordinator.RunConfig {
	c := coordinator.RunConfig{Dim: f.dim, SampleRate: f.sampleRate, NoiseMode: coordinator.NoiseFloat, Accountant: f.accountantName}
	if f.mechanism == mechDiscreteGaussian {
		c.NoiseMode = coordinator.NoiseDiscrete
	}
	c.Optimizer.NoiseMultiplier, c.Optimizer.ClipNorm = sigma, f.clip
	return c
}

// lattice returns v with --dim, 0 (omitted from JSON) without.
func (f *privacyFlags) lattice(v float64) float64 {
	if f.dim == 0 {
		return 0
	}
	return v
}

// effective returns the noise multiplier the event charges for σ: σ_eff
// for the leader's discrete Gaussian (--dim), σ otherwise.
func (f *privacyFlags) effective(sigma float64) float64 {
	e := f.event(sigma)
	if e.Event != nil {
		return e.Event.NoiseMultiplier
	}
	return e.NoiseMultiplier
}

// accountant returns the --accountant's accountant: rdp over --orders
// (orderSet), or pld.
func (f *privacyFlags) accountant(rdp accounting.RDP) accounting.Accountant {
	if f.accountantName == accountantPLD {
		return accounting.PLD{}
	}
	return rdp
}

// epsilon returns ε at the flags' δ for σ, and the best Rényi order (NaN
// for the PLD accountant).
func (f *privacyFlags) epsilon(rdp accounting.RDP, sigma float64) (float64, float64, error) {
	if err := accounting.ValidateRun(f.sampleRate, sigma, f.steps, f.delta); err != nil {
		return 0, 0, err // validates q, σ, steps, δ
	}
	if f.accountantName == accountantPLD {
		eps, err := accounting.PLD{}.Epsilon(f.event(sigma), f.steps, f.delta)
		return eps, math.NaN(), err
	}
	return rdp.EpsilonOrder(f.event(sigma), f.steps, f.delta)
}

// calibrate returns the smallest σ whose ε is at most the target.
func (f *privacyFlags) calibrate(rdp accounting.RDP) (float64, error) {
	if !(f.sampleRate > 0 && f.sampleRate <= 1) {
		return 0, fmt.Errorf("%w: sample rate %v must be in (0, 1]", accounting.ErrInvalidParameter, f.sampleRate)
	}
	return f.accountant(rdp).Calibrate(f.target, f.steps, f.delta, f.event)
}

// describe names the accountant and mechanism for the text output.
func (f *privacyFlags) describe(order float64) string {
	mech := "Poisson-subsampled Gaussian"
	if f.mechanism == mechDiscreteGaussian {
		mech = "Poisson-subsampled discrete Gaussian"
	}
	if f.dim > 0 {
		mech += fmt.Sprintf(" on the leader's lattice (d = %d, C = %g)", f.dim, f.clip)
	}
	if f.accountantName == accountantPLD {
		return "PLD accountant, " + mech
	}
	return fmt.Sprintf("RDP accountant, best Rényi order α = %g, %s", order, mech)
}

func (f *privacyFlags) common(cmd *cobra.Command) {
	cmd.Flags().Float64Var(&f.sampleRate, "sample-rate", 0, "Poisson sampling rate q = B/N, in (0, 1] (required)")
	cmd.Flags().Int64Var(&f.steps, "steps", 0, "number of training steps, at least 1 (required)")
	cmd.Flags().Float64Var(&f.delta, "delta", 1e-5, "δ, in (0, 1)")
	cmd.Flags().StringVar(&f.orders, "orders", "default", "Rényi orders for --accountant rdp: default (a superset of Opacus's) or opacus")
	cmd.Flags().StringVar(&f.accountantName, "accountant", accountantRDP,
		"rdp (Rényi DP) or pld (privacy loss distribution: tighter; what new runs use by default)")
	cmd.Flags().StringVar(&f.mechanism, "mechanism", mechGaussian,
		"gaussian (continuous) or discrete-gaussian (the runs' default noise)")
	cmd.Flags().IntVar(&f.dim, "dim", 0,
		"with --mechanism discrete-gaussian: the model's parameter count d; the event is then the leader's discrete Gaussian for the run's σ, --clip and d (its σ_eff, and for pld its lattice, which pld requires)")
	cmd.Flags().Float64Var(&f.clip, "clip", 1, "with --dim: the clip norm C, which with d sets the leader's grid")
	cmd.Flags().BoolVar(&f.json, "json", false, "print machine-readable JSON with the inputs echoed")
	_ = cmd.MarkFlagRequired("sample-rate")
	_ = cmd.MarkFlagRequired("steps")
}

func newPrivacyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "privacy",
		Short: "Privacy accounting for the Poisson-subsampled Gaussian mechanism (RDP or PLD)",
		Long: `Privacy accounting for DP-SGD style runs: T steps of the Poisson-subsampled Gaussian
mechanism, add/remove-one adjacency.

--accountant rdp (the default here): the Rényi DP accountant of Mironov, Talwar and Zhang
(2019), converted to (ε, δ) with Balle et al. (2020), Thm. 21, as Opacus and dp_accounting do.
With --mechanism discrete-gaussian it accounts for discrete Gaussian noise (the Gaussian's bound
at integer orders, the chord between them).

--accountant pld: the privacy-loss-distribution accountant (connect-the-dots discretization,
Doroshenko et al. 2022): an upper bound on ε, typically 8-20% below RDP's. New runs use it by
default (budget check and σ calibration); runs choose theirs with --accountant or the run
file's accountant key (see coordinator local --help). For --mechanism discrete-gaussian it
charges the leader's discrete Gaussian through its lattice, so it needs --dim (and --clip):
the Gaussian's PLD at σ_eff plus the total variation between the discrete and the rounded
Gaussian noise (docs/PRIVACY.md item 12), in practice a few tenths of a percent of ε.

With --dim, --noise-multiplier (and the σ that sigma prints) is the run's configured σ, and
the event charged is the leader's at σ_eff = ⌈σC/Λ⌉/(C/Λ + √d), as a run charges it.`,
	}
	cmd.AddCommand(newEpsilonCmd(), newSigmaCmd())
	return cmd
}

// epsilonResult is the --json output of privacy epsilon.
type epsilonResult struct {
	SampleRate      float64  `json:"sample_rate"`
	NoiseMultiplier float64  `json:"noise_multiplier"`
	Steps           int64    `json:"steps"`
	Delta           float64  `json:"delta"`
	Orders          string   `json:"orders,omitempty"`
	Epsilon         float64  `json:"epsilon"`
	Order           *float64 `json:"optimal_order,omitempty"`
	Accountant      string   `json:"accountant"`
	Mechanism       string   `json:"mechanism"`
	// Dim, ClipNorm and EffectiveNoiseMultiplier: with --dim, the leader's
	// lattice and the σ_eff its event charges.
	Dim                      int     `json:"dim,omitempty"`
	ClipNorm                 float64 `json:"clip_norm,omitempty"`
	EffectiveNoiseMultiplier float64 `json:"effective_noise_multiplier,omitempty"`
}

// orderPtr returns the Rényi order for JSON, nil for the PLD accountant.
func orderPtr(o float64) *float64 {
	if math.IsNaN(o) {
		return nil
	}
	return &o
}

// ordersName returns the --orders value for JSON, empty for PLD.
func (f *privacyFlags) ordersName() string {
	if f.accountantName == accountantPLD {
		return ""
	}
	return f.orders
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
			if err := f.check(); err != nil {
				return err
			}
			rdp, err := orderSet(f.orders)
			if err != nil {
				return err
			}
			eps, order, err := f.epsilon(rdp, f.sigma)
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), epsilonResult{
					SampleRate: f.sampleRate, NoiseMultiplier: f.sigma, Steps: f.steps, Delta: f.delta,
					Orders: f.ordersName(), Epsilon: eps, Order: orderPtr(order), Accountant: f.accountantName, Mechanism: f.mechanism,
					Dim: f.dim, ClipNorm: f.lattice(f.clip), EffectiveNoiseMultiplier: f.lattice(f.effective(f.sigma)),
				})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "ε = %.4f at δ = %g (%s; q = %g, σ = %g, %d steps)\n",
				eps, f.delta, f.describe(order), f.sampleRate, f.sigma, f.steps)
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
	TargetEpsilon   float64  `json:"target_epsilon"`
	SampleRate      float64  `json:"sample_rate"`
	Steps           int64    `json:"steps"`
	Delta           float64  `json:"delta"`
	Orders          string   `json:"orders,omitempty"`
	NoiseMultiplier float64  `json:"noise_multiplier"`
	Epsilon         float64  `json:"epsilon"`
	Order           *float64 `json:"optimal_order,omitempty"`
	Accountant      string   `json:"accountant"`
	Mechanism       string   `json:"mechanism"`
	// Dim, ClipNorm and EffectiveNoiseMultiplier: with --dim, the leader's
	// lattice and the σ_eff its event charges.
	Dim                      int     `json:"dim,omitempty"`
	ClipNorm                 float64 `json:"clip_norm,omitempty"`
	EffectiveNoiseMultiplier float64 `json:"effective_noise_multiplier,omitempty"`
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
			if err := f.check(); err != nil {
				return err
			}
			rdp, err := orderSet(f.orders)
			if err != nil {
				return err
			}
			sigma, err := f.calibrate(rdp)
			if err != nil {
				return err
			}
			eps, order, err := f.epsilon(rdp, sigma)
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), sigmaResult{
					TargetEpsilon: f.target, SampleRate: f.sampleRate, Steps: f.steps, Delta: f.delta,
					Orders: f.ordersName(), NoiseMultiplier: sigma, Epsilon: eps, Order: orderPtr(order), Accountant: f.accountantName, Mechanism: f.mechanism,
					Dim: f.dim, ClipNorm: f.lattice(f.clip), EffectiveNoiseMultiplier: f.lattice(f.effective(sigma)),
				})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "σ = %.6f gives ε = %.4f ≤ %g at δ = %g (%s; q = %g, %d steps)\n",
				sigma, eps, f.target, f.delta, f.describe(order), f.sampleRate, f.steps)
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

package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

// scheduledSGDM is DP-SGD with momentum with a learning rate that may
// change every step, b ← μ·b + g̃, θ ← θ − η_t·b: dpadam's SGDM update
// (same float64 arithmetic and float32 rounding, checked bit for bit in
// the tests) with η_t supplied per step, which the product's constant-η
// optimizer does not offer. It exists for the Eq. 3 experiment only.
type scheduledSGDM struct {
	mu float64
	b  []float32
}

func (s *scheduledSGDM) Step(theta, g []float32, lr float64) {
	b := s.b[:len(theta)]
	g = g[:len(theta)]
	for i := range theta {
		bi := float64(s.mu*float64(b[i])) + float64(g[i])
		b[i] = float32(bi)
		u := float64(lr * bi)
		theta[i] = float32(float64(theta[i]) - u)
	}
}

// eq3LR is the paper's Eq. 3: the DP-SGDM learning rate that makes DP-SGDM
// take DP-Adam's step when v̂ ≈ Φ,
//
//	η_t^SGDM = η^Adam·(1−β)/((1−β^t)·√Φ), β = β1.
func eq3LR(lrAdam, beta float64, t int, phi float64) float64 {
	return lrAdam * (1 - beta) / ((1 - math.Pow(beta, float64(t))) * math.Sqrt(phi))
}

// sgdmExperiment trains DP-Adam (the product optimizer) and DP-SGDM with
// the Eq. 3 schedule from the same initialization on the same Poisson
// batches and the same noise draws z_t (identically seeded sources), and
// records the NON-PRIVATE training loss of both on a fixed 2000-example
// training subset every few steps. It writes sgdm.csv, sgdm.md,
// sgdm_loss.png and sgdm_lr.png.
func sgdmExperiment(ctx context.Context, t *Task, o options, log *slog.Logger) error {
	sigma, err := sigmaFor(t, o.tuneEps)
	if err != nil {
		return err
	}
	sub := evalSubset(t.Train, 2000)
	every := max(1, t.Steps/60)
	rows := [][]string{{"task", "lr_adam", "step", "train_loss_dp_adam_NONPRIVATE", "train_loss_dp_sgdm_eq3_NONPRIVATE", "lr_sgdm"}}
	var md strings.Builder
	fmt.Fprintf(&md, "Task %s, ε = %g (σ = %.4f), B = %g, C = %g, %d steps, β1 = μ = 0.9, β2 = 0.999, seed 1.\n\n",
		t.Name, o.tuneEps, sigma, t.B, t.C, t.Steps)
	md.WriteString("| η (DP-Adam) | Φ | final η_t (DP-SGDM) | mean squared difference of training loss | final train loss DP-Adam / DP-SGDM | final test accuracy DP-Adam / DP-SGDM |\n| --- | --- | --- | --- | --- | --- |\n")
	var curves []series
	var phi float64
	for _, lrA := range []float64{1e-3, 3e-3} {
		cfg := optimizerConfig(t, dpadam.Adam, Hyper{LR: lrA}, sigma)
		phi = cfg.Phi()
		m, err := model.New(t.Spec)
		if err != nil {
			return err
		}
		thetaA := make([]float32, m.NumParams())
		if err := m.Init(thetaA, 1); err != nil {
			return err
		}
		thetaS := append([]float32(nil), thetaA...)
		opt, err := dpadam.New(cfg, m.NumParams())
		if err != nil {
			return err
		}
		sgdm := &scheduledSGDM{mu: cfg.Beta1, b: make([]float32, m.NumParams())}
		stA, err := newStepper(t, m, cfg, 1)
		if err != nil {
			return err
		}
		stS, err := newStepper(t, m, cfg, 1)
		if err != nil {
			return err
		}
		ews, err := m.NewWorkspace(1024)
		if err != nil {
			return err
		}
		var xs, la, ls []float64
		var sqd float64
		var n int
		record := func(step int) error {
			ma, err := ews.EvaluateDataset(thetaA, sub)
			if err != nil {
				return err
			}
			ms, err := ews.EvaluateDataset(thetaS, sub)
			if err != nil {
				return err
			}
			xs, la, ls = append(xs, float64(step)), append(la, ma.Loss), append(ls, ms.Loss)
			d := ma.Loss - ms.Loss
			sqd += d * d
			n++
			rows = append(rows, []string{t.Name, g(lrA), fmt.Sprint(step), g(ma.Loss), g(ms.Loss), g(eq3LR(lrA, cfg.Beta1, max(step, 1), phi))})
			return nil
		}
		if err := record(0); err != nil {
			return err
		}
		for step := 1; step <= t.Steps; step++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := stA.Next(thetaA); err != nil {
				return err
			}
			if _, err := opt.Step(thetaA, stA.G); err != nil {
				return err
			}
			if err := stS.Next(thetaS); err != nil {
				return err
			}
			sgdm.Step(thetaS, stS.G, eq3LR(lrA, cfg.Beta1, step, phi))
			if step%every == 0 || step == t.Steps {
				if err := record(step); err != nil {
					return err
				}
			}
		}
		ta, err := ews.EvaluateDataset(thetaA, t.Test)
		if err != nil {
			return err
		}
		ts, err := ews.EvaluateDataset(thetaS, t.Test)
		if err != nil {
			return err
		}
		msd := sqd / float64(n)
		log.Info("sgdm", "task", t.Name, "lr_adam", lrA, "phi", phi, "msd", msd, "test_adam", ta.Accuracy, "test_sgdm", ts.Accuracy)
		fmt.Fprintf(&md, "| %g | %.4g | %.4g | %.4g | %.4f / %.4f | %.2f%% / %.2f%% |\n", lrA, phi,
			eq3LR(lrA, cfg.Beta1, t.Steps, phi), msd, la[len(la)-1], ls[len(ls)-1], 100*ta.Accuracy, 100*ts.Accuracy)
		curves = append(curves,
			series{Name: fmt.Sprintf("DP-Adam η=%g", lrA), X: xs, Y: la},
			series{Name: fmt.Sprintf("DP-SGDM, Eq. 3 schedule (from η=%g)", lrA), X: xs, Y: ls})
	}
	if err := writeCSV(filepath.Join(o.out, "sgdm.csv"), rows); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "sgdm.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	if err := plotLines(filepath.Join(o.out, "sgdm_loss.png"),
		fmt.Sprintf("%s: DP-Adam vs DP-SGDM with the Eq. 3 schedule (ε=%g)", t.Name, o.tuneEps),
		"step", "training loss on 2000 training examples (NON-PRIVATE)", curves); err != nil {
		return err
	}
	// Figure 2 (left): the implied schedule for this task's Φ and the
	// paper's two settings, η^Adam = 1e-3, β = 0.9.
	var sched []series
	for _, p := range []struct {
		name string
		phi  float64
	}{
		{fmt.Sprintf("this task, Φ=%.3g", phi), phi},
		{"paper 'small' Φ (B=256, C=0.1, σ=0.4)", math.Pow(0.4*0.1/256, 2)},
		{"paper 'large' Φ (B=256, C=1, σ=1)", math.Pow(1.0/256, 2)},
	} {
		s := series{Name: p.name}
		for step := 1; step <= t.Steps; step++ {
			s.X, s.Y = append(s.X, float64(step)), append(s.Y, eq3LR(1e-3, 0.9, step, p.phi))
		}
		sched = append(sched, s)
	}
	return plotLines(filepath.Join(o.out, "sgdm_lr.png"), "Eq. 3: DP-SGDM learning rate equivalent to DP-Adam η=1e-3",
		"step", "η_t (DP-SGDM)", sched)
}

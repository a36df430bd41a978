// Package dpadam implements the differentially private optimizers of Tang,
// Shpilevskiy and Lécuyer, "DP-AdamBC: Your DP-Adam Is Actually DP-SGD
// (Unless You Apply Bias Correction)", AAAI 2024 (paper/dp-adambc.tex):
// DP-AdamBC (Algorithm 1) and the baselines DP-Adam, DP-SGD and DP-SGD with
// momentum, over flat []float32 parameter vectors.
//
// The optimizers only post-process the privatized gradient
//
//	g̃ = (Σ_i clip_C(g_i) + z)/B,  z ~ N(0, σ²C²I),
//
// which the caller forms (in dpcluster, the coordinator's leader). They never
// see per-example data and so cost no privacy beyond the mechanism that made
// g̃ (paper §4, Proposition 1). DP-AdamBC removes the noise bias
// Φ = (σC/B)² from Adam's second-moment estimate:
//
//	m ← β1·m + (1−β1)·g̃          m̂ = m/(1−β1^t)
//	v ← β2·v + (1−β2)·g̃²         v̂ = v/(1−β2^t)
//	θ ← θ − η·m̂/sqrt(max(v̂ − Φ, γ'))
//
// Step is deterministic to the bit on every platform (products are rounded
// explicitly so no FMA contraction can occur; the amd64 AVX2 kernel for
// DP-AdamBC performs the same IEEE operations as the Go one), allocates nothing,
// and rejects a non-finite g̃ without touching any state, so it can run
// inside a replicated state machine. MarshalBinary/UnmarshalBinary give a
// versioned, checksummed snapshot of the whole optimizer.
//
// Typical use:
//
//	cfg := dpadam.DefaultConfig()
//	cfg.NoiseMultiplier, cfg.ClipNorm, cfg.ExpectedBatchSize = 0.4, 0.1, 256
//	opt, err := dpadam.New(cfg, len(theta))
//	if err != nil { ... }
//	for each step {
//		noisyGrad := ... // g̃ from the Gaussian mechanism
//		diag, err := opt.Step(theta, noisyGrad)
//		if errors.Is(err, dpadam.ErrNonFinite) { ... } // nothing changed
//	}
package dpadam

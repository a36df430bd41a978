// Package mechanism is the leader's secure Gaussian mechanism: the sum of
// clipped gradients snapped to a fine grid, plus exactly sampled discrete
// Gaussian noise, released as a function of integers only. It replaces
// floating-point Gaussian noise, whose outputs lie on the sampler's lattice
// and reveal the sum's low-order bits (Mironov, "On Significance of the
// Least Significant Bits for Differential Privacy", CCS 2012).
//
//	m, err := mechanism.NewDiscreteGaussian(sigma, clip, dim) // grid, scale, σ_eff
//	event := m.Event(q)                                        // what the ledger charges
//	var noise mechanism.Noise
//	err = m.Draw(&noise, csprng)                 // before the sum is known
//	err = m.Apply(gTilde, sum, expectedBatch, &noise) // g̃ = Λ(round(S/Λ) + z)/B
//
// The mechanism (DiscreteGaussian) and its accounting. Λ is the largest
// power of two with √d·Λ ≤ C/2¹⁶, so the snapped sum's L2 sensitivity is
// C/Λ + √d grid steps, and the noise scale is s = ⌈σC/Λ⌉ grid steps. The
// ledger charges the Poisson-subsampled discrete Gaussian at the effective
// noise multiplier σ_eff = s/(C/Λ + √d) ≥ σ/(1 + 2⁻¹⁶); see
// accounting.SubsampledDiscreteGaussianRDP for why its Rényi DP is bounded by
// the continuous Gaussian's, where it is equal, and where it is
// interpolated conservatively.
//
// The samplers. Every deviate is exact: its probability is exactly that of
// N_Z(0, s²) given uniform random bits, with integer arithmetic only.
//   - CKS (sampler.go): Canonne, Kamath and Steinke 2020, Algorithms 1–3:
//     discrete Laplace proposals accepted with probability
//     exp(−(|y| − s)²/(2s²)), Bernoulli(exp(−γ)) by von Neumann's method.
//     It serves scales below 2¹².
//   - The table sampler (table.go), for s ≥ 2¹²: rejection from a step
//     envelope over blocks of s/64 to s/128 magnitudes, picked by an exact
//     integer alias table whose weights are certified upward roundings of
//     exp(−x²/(2s²)) (expbound.go); within a block the acceptance factors
//     into a per-block constant, compared with its certified digits, and
//     exp(−δ) for a small rational δ. About three 64-bit words per
//     deviate.
//
// The noise source. NoiseSource is the leader's CSPRNG (ChaCha8 keyed from
// crypto/rand; NewSeededNoiseSource for tests and explicit insecure runs)
// and offers both releases: DiscreteNoisyGradient64 and DrawDiscrete for
// this package's mechanism, and NoisyGradient64, the legacy floating-point
// Gaussian sampler kept for runs configured with noise mode "float" and for
// train.Run.
//
// Randomness and concurrency. Noise for d coordinates is drawn in chunks of
// 16384, each from its own ChaCha8 stream keyed, in chunk order, from the
// caller's CSPRNG, on up to GOMAXPROCS goroutines that are joined before
// Draw returns: a seeded source gives the same noise on any number of
// workers. A DiscreteGaussian is a value and safe to share; a Noise is not
// safe for concurrent use.
package mechanism

// Package accounting is dpcluster's privacy accounting: the event model
// that says which mechanism ran and how often, and two accountants that
// turn a composition of events into (ε, δ)-differential privacy, calibrate
// the noise multiplier σ for a target ε, and find how many steps a budget
// allows. It is pure math: no files, no clocks, no randomness. The durable
// ledger that charges events and enforces a run's budget is package ledger;
// the leader's noise, whose events this package charges, is package
// mechanism.
//
// # Events
//
// An Event describes a mechanism that ran, after Google dp_accounting's
// DpEvent classes: a Gaussian (KindGaussian) or discrete Gaussian
// (KindDiscreteGaussian) release with noise multiplier σ (noise scale over
// L2 sensitivity), run on a Poisson subsample (KindPoissonSampled), run
// count times (KindSelfComposed), or a list of events run once each
// (KindComposed). One DP-SGD step is SubsampledGaussian(q, σ); a step of a
// run whose leader adds discrete Gaussian noise is
// SubsampledDiscreteGaussian(q, σ_eff), or, naming the lattice that the
// PLD accountant needs, PoissonSampled(q, DiscreteGaussianLattice(σ_eff,
// s, d)) (mechanism.DiscreteGaussian builds both). Events are values;
// Marshal and UnmarshalEvent give their versioned JSON form (EventFormat),
// the bytes a ledger record and a Raft entry hold.
//
// # Accountants
//
// An Accountant answers three questions about a run: Epsilon (the ε, at δ,
// of count runs of an event), Calibrate (the smallest σ whose ε stays
// within a target) and StepLimit (the most runs of a step a target
// allows). New returns one by Name, the string a run file, the
// --accountant flag and a ledger's run record hold: NameRDP or NamePLD.
//
//	acc, err := accounting.New(accounting.NamePLD)
//	eps, err := acc.Epsilon(accounting.SubsampledGaussian(256.0/60000, 1.1), 1000, 1e-5)
//
// Both are deterministic functions of their inputs (every replica and
// every auditor computes the same ε, bit for bit) and safe for concurrent
// use. Both report upper bounds on the exact ε, up to the numeric errors
// stated below; PLD's is the tighter (8-20% below RDP's on DP-SGD runs).
//
// # RDP: Rényi differential privacy
//
// RDP (rdp.go, rdp_accountant.go) composes Rényi DP over a fixed set of
// orders α (DefaultOrders: Opacus's orders, OpacusOrders, plus orders near
// 1 and up to 1024) and converts the sum to (ε, δ):
//
//   - one Gaussian release has RDP α/(2σ²) (Mironov, "Rényi Differential
//     Privacy", CSF 2017, Prop. 7), and RDP adds under composition (ibid.,
//     Prop. 1);
//   - the Poisson-subsampled Gaussian has RDP log(A_α)/(α−1), with A_α by
//     the closed form of Mironov, Talwar and Zhang, "Rényi Differential
//     Privacy of the Sampled Gaussian Mechanism" (2019), Sec. 3.3, at
//     integer α and their series of Sec. 3.4 at fractional α
//     (SubsampledGaussianRDP), as Opacus and tensorflow_privacy compute it;
//   - the subsampled discrete Gaussian (Canonne, Kamath and Steinke, "The
//     Discrete Gaussian for Differential Privacy", NeurIPS 2020) has the
//     same bound at integer orders and, at fractional orders, the chord of
//     log A between the neighbouring integers, which convexity puts above
//     it (SubsampledDiscreteGaussianRDP writes out the proof);
//   - ε = min_α RDP(α) + log((α−1)/α) − (log δ + log α)/(α−1) (Balle,
//     Barthe, Gaboardi, Hsu and Sato, AISTATS 2020, Thm. 21; RDPToEpsilon).
//
// Numeric error: the integer-order sum is float64 with relative error
// about 1e-15 per term; the fractional series stops once both terms fall
// below e^−30, as Opacus does; log erfc beyond 25 uses an asymptotic
// series accurate to 1e-12 relative. The conformance test checks ε against
// Opacus's reference values to 1e-6 relative (testdata/conformance).
// RDPComposition is the stateful form a ledger charges step by step.
//
// # PLD: privacy loss distributions
//
// PLD (pld.go and the pld_*.go files it names) computes the privacy loss
// distribution of the Poisson-subsampled Gaussian in both adjacency
// directions (pairs tight by Zhu, Dong and Wang, AISTATS 2022, Sec. 5),
// discretizes it pessimistically by "connect the dots" (Doroshenko, Ghazi,
// Kamath, Kumar and Manurangsi, PETS 2022), composes by one FFT with
// exponential tilting on a window placed by Chernoff bounds, and solves
// the hockey-stick divergence for the smallest ε with δ(ε) ≤ δ. Every
// approximation is on the pessimistic side: mass outside the window goes
// to +∞ or is bounded with the discretized PLD's own moment generating
// function. The discrete Gaussian (pld_discrete.go) is compared with the
// rounded continuous Gaussian, whose PLD is the Gaussian's: their outputs
// differ in total variation by at most d·τ(s) per step
// (DiscreteGaussianTV), which is charged as extra δ, (1 + e^ε)·Σ d·τ(s);
// where that slack is useless (small lattices) or the window cannot
// bracket the answer, PLD reports the RDP bound instead, also an upper
// bound, and never an error.
//
// Numeric error: the reported ε may fall below the exact ε by at most a
// relative PLDNumericError (1e-6, a loose bound on FFT round-off, ~1e-10
// relative with the tilt, and the interval masses' ~1e-12); above it, the
// discretization costs O(T·h²), below 5e-4 relative by the choice of the
// grid spacing h (TestPLDDiscretizationError measures it for 1 to 10⁴
// steps). Each evaluation costs two FFT compositions (about 10-250 ms), so
// PLD remembers its results and prepared compositions (ResetCaches drops
// them; results never depend on them).
//
// # Calibration and step limits
//
// Both accountants calibrate σ with one search (calibrate.go): a bracket
// in [1e-3, 1e4] whose upper end doubles from a start (1 for RDP, RDP's σ
// for PLD) until ε ≤ target and whose lower end then walks down, refined
// by bisection to 1e-9 relative (RDP) or by regula falsi with the Illinois
// modification to 1e-6 relative (PLD, whose evaluations are costly). The
// σ returned is always the bracket's upper end, so its ε never exceeds the
// target; ErrUnreachable says no σ in range reaches it. StepLimit
// (steplimit.go) is the largest count T within the target: a doubling and
// bisection on T·RDP(step) for RDP; for PLD a bracketing secant on log ε
// against log T from the run's planned steps or RDP's limit.
//
// # Errors
//
// Bad inputs are ErrInvalidParameter; events out of range or not
// chargeable by the accountant are ErrInvalidEvent; unknown serialized
// formats are ErrEventFormat; unreachable targets are ErrUnreachable.
package accounting

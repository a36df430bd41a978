// Package aggregation validates and sums the contributions of one training
// round: it accepts a contribution only for the open step (and round ID),
// from a registered node, once, with the right dimension, finite values, a
// non-negative count and a norm no clipped sum can exceed, and sums the
// accepted ones in a fixed order so the result does not depend on arrival
// order.
//
// A Round closes when every registered node has had a contribution
// accepted, at its deadline, or when Close is called, whichever is first:
//
//	r, err := aggregation.NewRound(step, nodes, dim, clipNorm, deadline,
//		aggregation.WithRoundID(roundID))
//	...
//	// for each contribution received (concurrently is fine):
//	if err := r.Add(c); err != nil {
//		metrics.Inc(aggregation.ReasonOf(err).String()) // never log c.Sum or c.Count
//	}
//	...
//	res, err := r.Wait(ctx) // or <-r.Done(); res := r.Close()
//	// res.Sum is Σ of accepted sums in float64; add noise, divide by B.
//
// # Validation
//
// A contribution with Count n and Sum s is accepted only if
// ‖s‖₂ ≤ n·C·(1+1e-6), C the clip norm: the sum of n vectors each clipped
// to norm C cannot exceed n·C (triangle inequality), and 1e-6 covers the
// node's float32 rounding. The norm is computed in float64 from float32
// values, which cannot overflow or underflow: each square is at most
// (3.5e38)² ≈ 1.2e77 and at least (1.4e-45)² ≈ 2e-90, and a sum of fewer than
// 2³¹ such terms stays below 1e87, far inside float64's range, so the
// scaling of an overflow-safe norm (LAPACK dnrm2, gonum floats.Norm) is not
// needed.
//
// # Determinism and memory
//
// Float addition is not associative, so a sum accumulated in arrival order
// would depend on network timing. A Round therefore keeps each accepted
// node's float32 sum (it takes ownership of the slice, nodes×dim×4 bytes)
// and at close adds them in float64 in ascending node-ID order, element by
// element. The result is bit-identical for any arrival order and any
// interleaving of concurrent Adds. Per-node sums are released at close.
//
// # Privacy
//
// Sums and counts are un-noised private data. This package never logs;
// rejections carry a node ID and a Reason (an enum for metrics and logs),
// never values. Result.Sum and Result.Count must not leave the leader's
// memory before noise is added.
package aggregation

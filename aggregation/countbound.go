package aggregation

import "math"

// CountTail is the probability, per node and step, that an honest node's
// Poisson sample exceeds CountBound and its contribution is refused:
// 2^-64. Refusing it is a departure from the mechanism the ledger charges
// that happens with at most this probability, so over T steps and k nodes
// the run's guarantee holds at δ + T·k·2^-64 (for 10^4 steps and 10^3
// nodes, δ + 5.5·10^-13): docs/PRIVACY.md, "What a malicious node can do".
const CountTail = 0x1p-64

// CountBound returns a bound k on the size of a Poisson sample of n
// examples at rate q (a Binomial(n, q) count) that the sample exceeds with
// probability at most CountTail, and never more than n. It is the
// multiplicative Chernoff bound P(X ≥ μ + t) ≤ exp(−t²/(2μ + t)) for a sum
// of independent Bernoulli variables with mean μ = n·q (Mitzenmacher and
// Upfal, Probability and Computing, Thm. 4.4 in the form for t = δμ, any
// δ > 0), solved for t with L = ln(1/CountTail) = 64·ln 2:
// t = (L + √(L² + 8μL))/2. The float64 arithmetic errs by far less than
// the 1 added before rounding up, so the returned k is at least the exact
// solution. It bounds what a node can claim to have summed, and so the
// norm of what it can inject (count·C), to about μ + √(2μL) + L examples
// instead of its whole shard.
func CountBound(n int64, q float64) int64 {
	if n <= 0 {
		return 0
	}
	if !(q > 0) {
		return 0
	}
	mu := float64(n) * math.Min(q, 1)
	l := 64 * math.Ln2
	t := (l + math.Sqrt(l*l+8*mu*l)) / 2
	k := math.Ceil(mu + t + 1)
	if k >= float64(n) {
		return n
	}
	return int64(k)
}

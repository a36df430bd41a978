package accounting

import (
	"math"
)

// This file discretizes one step's privacy loss distribution onto the
// window's grid by the pessimistic split (2) of accounting/pld.go, and
// tilts it for the FFT.

// stepPLD is one event's discretized PLD on the grid: finite masses at
// ℓ = (first+k)·h, and the atom at +∞.
type stepPLD struct {
	first int64
	mass  []float64
	inf   float64
}

// xOf returns the x at which 1−q+q·e^{(2x−1)/(2σ²)} = e^v, or −∞ if
// e^v ≤ 1−q: the inverse of the remove-direction loss.
func xOf(q, sigma, v float64) float64 {
	if q == 1 {
		return sigma*sigma*v + 0.5
	}
	em := math.Expm1(v) + q // e^v − 1 + q
	if !(em > 0) {
		return math.Inf(-1)
	}
	return sigma*sigma*(math.Log(em)-math.Log(q)) + 0.5
}

// lossOf returns the remove-direction loss at x, log(1−q+q·e^{(2x−1)/(2σ²)}).
func lossOf(q, sigma, x float64) float64 {
	z := (2*x - 1) / (2 * sigma * sigma)
	if q == 1 {
		return z
	}
	// log(1−q+q e^z) = logAdd(log(1−q), log q + z)
	return logAdd(math.Log1p(-q), math.Log(q)+z)
}

// normUpper returns P(N(0,1) > z), accurate in the upper tail.
func normUpper(z float64) float64 { return 0.5 * math.Erfc(z/math.Sqrt2) }

// tails returns P(L > v) and Q(L > v) for the direction, with their
// complements where those are the accurate side: upper reports whether the
// returned pair is the upper tail (P(L>v), Q(L>v)) or the lower
// (P(L≤v), Q(L≤v)).
func tails(dir pldDirection, q, sigma, v float64, upper bool) (pm, qm float64) {
	sf := func(z float64) float64 { // upper tail
		if upper {
			return normUpper(z)
		}
		return normUpper(-z)
	}
	if dir == pldRemove {
		// L > v ⇔ x > x*; P = M, Q = μ0.
		x := xOf(q, sigma, v)
		if math.IsInf(x, -1) {
			if upper {
				return 1, 1
			}
			return 0, 0
		}
		pu := (1-q)*sf(x/sigma) + q*sf((x-1)/sigma)
		qu := sf(x / sigma)
		return pu, qu
	}
	// add: L > v ⇔ log(1−q+q e^z) < −v ⇔ x < x*(−v); P = μ0, Q = M.
	x := xOf(q, sigma, -v)
	if math.IsInf(x, -1) { // L ≤ −log(1−q) < ... : L > v impossible
		if upper {
			return 0, 0
		}
		return 1, 1
	}
	// P(x < x*) is the "upper" side in loss; flip the Gaussian tail.
	lf := func(z float64) float64 { return sf(-z) }
	pu := lf(x / sigma)
	qu := (1-q)*lf(x/sigma) + q*lf((x-1)/sigma)
	return pu, qu
}

// buildStep discretizes one step's PLD in direction dir onto the grid of
// spacing h by (2), over grid indices [jlo, jhi].
func buildStep(dir pldDirection, q, sigma, h float64, jlo, jhi int64) stepPLD {
	n := int(jhi - jlo + 1)
	mass := make([]float64, n)
	eh := math.Expm1(h)
	// Upper-tail masses S(ℓ) are accurate where small; lower-tail F(ℓ)
	// where S is near 1. Switch at the median of P's loss.
	prevP, prevQ := 0.0, 0.0 // cumulative from below at the current point
	usingUpper := false
	var upP, upQ float64 // upper tails at the current point, when usingUpper
	{
		p, qq := tails(dir, q, sigma, float64(jlo)*h, true)
		if p < 0.5 {
			usingUpper, upP, upQ = true, p, qq
		} else {
			prevP, prevQ = tails(dir, q, sigma, float64(jlo)*h, false)
		}
	}
	// Everything at or below ℓ_lo goes to ℓ_lo (pessimistic move up).
	if usingUpper {
		mass[0] = 1 - upP
	} else {
		mass[0] = prevP
	}
	for k := 0; k < n-1; k++ {
		v := float64(jlo+int64(k)+1) * h
		var pI, qI float64
		if !usingUpper {
			up, uq := tails(dir, q, sigma, v, true)
			if up < 0.5 {
				// Switch to upper tails from here on.
				fp, fq := 1-up, 1-uq
				pI, qI = fp-prevP, fq-prevQ
				usingUpper, upP, upQ = true, up, uq
			} else {
				fp, fq := tails(dir, q, sigma, v, false)
				pI, qI = fp-prevP, fq-prevQ
				prevP, prevQ = fp, fq
			}
		} else {
			up, uq := tails(dir, q, sigma, v, true)
			pI, qI = upP-up, upQ-uq
			upP, upQ = up, uq
		}
		a, b := splitInterval(pI, qI, v, h, eh)
		mass[k] += a
		mass[k+1] += b
	}
	// Top interval (ℓ_hi, ∞): a = e^{ℓ_hi}·Q(L > ℓ_hi) at ℓ_hi, the rest
	// δ(ℓ_hi) at +∞.
	var topP, topQ float64
	if usingUpper {
		topP, topQ = upP, upQ
	} else {
		fp, fq := prevP, prevQ
		topP, topQ = 1-fp, 1-fq
	}
	a := 0.0
	if topQ > 0 && topP > 0 {
		a = math.Min(topP, math.Exp(float64(jhi)*h+math.Log(topQ)))
	}
	mass[n-1] += a
	for k := range mass {
		if !(mass[k] > 0) {
			mass[k] = 0
		}
	}
	return stepPLD{first: jlo, mass: mass, inf: math.Max(topP-a, 0)}
}

// splitInterval splits an interval (v−h, v] of P-mass p and Q-mass r onto
// its ends by (2), returning the masses at v−h and v.
func splitInterval(p, r, v, h, eh float64) (lower, upper float64) {
	if !(p > 0) {
		return 0, 0
	}
	if !(r > 0) {
		return 0, p
	}
	// t = log(e^{v}·r/p) ∈ [0, h] in exact arithmetic.
	t := v + math.Log(r) - math.Log(p)
	t = math.Min(math.Max(t, 0), h)
	lower = p * math.Expm1(t) / eh
	return lower, p - lower
}

// tilt returns log Σ_k m_k e^{sℓ_k} (K(s) of the finite part) and, if dst
// is not nil, writes the tilted, normalized masses m_k e^{sℓ_k}/e^{K(s)}
// into dst, folded modulo len(dst) from the step's first grid point.
func (st stepPLD) tilt(dst []float64, s, h float64) float64 {
	// Normalize by the largest term, in log space, so nothing overflows.
	// log m_k + s·ℓ_k is concave-ish in k but we take the plain maximum.
	maxLog := math.Inf(-1)
	for k, m := range st.mass {
		if m > 0 {
			maxLog = math.Max(maxLog, math.Log(m)+s*float64(st.first+int64(k))*h)
		}
	}
	if dst != nil {
		clear(dst)
	}
	z := 0.0
	n := len(dst)
	for k, m := range st.mass {
		if m > 0 {
			v := math.Exp(math.Log(m) + s*float64(st.first+int64(k))*h - maxLog)
			z += v
			if dst != nil {
				dst[k%n] += v
			}
		}
	}
	for k := range dst {
		dst[k] /= z
	}
	return maxLog + math.Log(z)
}

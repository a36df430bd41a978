package accounting

import (
	"math"
	"math/cmplx"
	"slices"

	"gonum.org/v1/gonum/dsp/fourier"
)

// This file composes the discretized steps by FFT (accounting/pld.go,
// "Composition by FFT, with exponential tilting") and solves (1) for ε on
// the composition.

// composedPLD is the composition of some events in one direction on a
// window: finite masses at ℓ_i = (w.lo+i)·h and the atom at +∞ (including
// the bound (3) on the finite mass above the window).
type composedPLD struct {
	w    pldWindow
	mass []float64
	inf  float64
	// tailA[i] = Σ_{k>i} mass[k] and tailB[i] = Σ_{k>i} mass[k]·e^{ℓ_i−ℓ_k}
	// (solve's δ(ℓ_i) = tailA[i] − tailB[i]), summed from the top.
	tailA, tailB []float64
}

// tails fills c's suffix sums: b_i = e^{−h}·(m_{i+1} + b_{i+1}).
func (c *composedPLD) tails() {
	n := len(c.mass)
	c.tailA, c.tailB = make([]float64, n), make([]float64, n)
	rho := math.Exp(-c.w.h)
	for i := n - 2; i >= 0; i-- {
		c.tailA[i] = c.tailA[i+1] + c.mass[i+1]
		c.tailB[i] = rho * (c.tailB[i+1] + c.mass[i+1])
	}
}

// compose composes events in direction dir from their prepared steps
// (prep.steps[dir], in the same order as events).
func (prep *pldPrepared) compose(events []PLDEvent, dir pldDirection) composedPLD {
	w := prep.w
	n := w.n
	fft := getFFT(n)
	defer putFFT(fft)
	spec := make([]complex128, n/2+1)
	for i := range spec {
		spec[i] = 1
	}
	logScale := 0.0 // Σ count·log Z
	logFinite := 0.0
	var shift int64 // Σ count·first: the composed grid index of cell 0
	for i, e := range events {
		ps := &prep.steps[dir][i]
		c := float64(e.Count)
		logScale += c * ps.logZ
		logFinite += c * ps.logFinite
		shift += e.Count * ps.first
		for k := range spec {
			// v^c = |v|^c·e^{i·c·arg v}, through polar form so that large
			// c neither overflows nor loses the phase; coefficients whose
			// power underflows skip the rotation.
			r := math.Exp(c * ps.logAbs[k])
			if r == 0 {
				spec[k] = 0
				continue
			}
			spec[k] *= cmplx.Rect(r, math.Mod(c*ps.phase[k], 2*math.Pi))
		}
	}
	seq := make([]float64, n)
	fft.Sequence(seq, spec)
	// Cell i of the cyclic result holds composed grid index ≡ shift+i (mod
	// n); read it out on the window [w.lo, w.lo+n).
	mass := make([]float64, n)
	off := mod(w.lo-shift, int64(n))
	for i := range mass {
		r := seq[(int64(i)+off)%int64(n)] / float64(n)
		if !(r > 0) {
			continue
		}
		l := float64(w.lo+int64(i)) * w.h
		if x := logScale - w.lambda*l; x < 700 {
			mass[i] = r * math.Exp(x)
		} else {
			mass[i] = math.Exp(math.Log(r) + x)
		}
	}
	// Atom at +∞: composed infinite mass plus the bound (3) on the finite
	// mass above the window, minimized over the exponents λ and tTop.
	inf := -math.Expm1(logFinite)
	top := float64(w.lo+int64(n)) * w.h
	best := 1.0
	for j, t := range []float64{w.lambda, w.tTop} {
		if !(t > 0) {
			continue
		}
		k := 0.0
		for i, e := range events {
			k += float64(e.Count) * prep.steps[dir][i].cgf[j]
		}
		best = math.Min(best, math.Exp(k-t*top))
	}
	c := composedPLD{w: w, mass: mass, inf: inf + best}
	c.tails()
	return c
}

// pldPrepared is the part of a PLD evaluation that does not depend on the
// events' exact counts: the window, placed for the counts rounded up to
// powers of two (pldShape), and each event's discretized step PLD on it,
// tilted and Fourier-transformed, in both directions. A run of identical
// steps evaluated at many counts (the ledger's count grid, the step-limit
// search) prepares once per power of two and then pays only the pointwise
// power, one inverse FFT and the solve per count: about a third of the
// whole. Read-only once built; shared through pldPrepCache.
type pldPrepared struct {
	w     pldWindow
	steps [2][]preparedStep // by pldDirection, then event
	rdp   [][]float64       // by event: one step's RDP over DefaultOrders (rdpEpsilon)
	size  int               // bytes held, for the cache's bound
	// wide marks, in the cache, a bucket whose window would be too wide to
	// share (pldPrepare); such an entry holds nothing else.
	wide bool
}

// preparedStep is one event's step PLD in one direction on the window.
type preparedStep struct {
	// logAbs and phase are the real FFT of the tilted masses (folded
	// modulo N) in polar form, log|v| and arg v.
	logAbs, phase []float64
	logZ          float64    // log of the tilt's normalizer
	logFinite     float64    // log(1 − the step's atom at +∞)
	first         int64      // grid index of the step's first mass
	cgf           [2]float64 // K(s) of the finite part at s = λ and s = tTop, for (3)
}

// pldShape returns the bucket of counts events falls in: events with
// each count rounded down to a power of two, plus one (lo), and up to one
// (hi). A window placed for a bucket (pldWindowFor(lo, hi)) serves every
// count in it, so all of them can share one pldPrepared.
func pldShape(events []PLDEvent) (lo, hi []PLDEvent) {
	lo, hi = slices.Clone(events), slices.Clone(events)
	for i := range hi {
		c := int64(1)
		for c < hi[i].Count && c < 1<<62 {
			c <<= 1
		}
		hi[i].Count = c
		lo[i].Count = min(c/2+1, c)
	}
	return lo, hi
}

// rdpEpsilon is the RDP accountant's ε for the same events (the fallback
// when the PLD window cannot bracket the answer, and the cap for discrete
// events; RDP is also an upper bound), from the prepared per-step curves:
// the discrete ones with the discrete Gaussian's RDP bound. +Inf if the
// conversion fails.
func (prep *pldPrepared) rdpEpsilon(events []PLDEvent, delta float64) float64 {
	orders := DefaultOrders()
	rdp := make([]float64, len(orders))
	for i, e := range events {
		for j, r := range prep.rdp[i] {
			rdp[j] += float64(e.Count) * r
		}
	}
	eps, _, err := RDPToEpsilon(orders, rdp, delta)
	if err != nil {
		return math.Inf(1)
	}
	return eps
}

// pldPrepare returns the prepared composition of events at δ (window
// 2^fine times as fine as the rule, for tests), from the cache or built.
// It uses the window of the events' bucket of counts (pldShape), unless
// that window's spacing is more than twice that of the window for the
// bucket's top counts alone (the loss's mean moves more within the bucket
// than the loss spreads, and the points are capped: long runs at large
// q), where each count gets the window of its own counts.
func pldPrepare(events []PLDEvent, delta float64, fine int) *pldPrepared {
	lo, hi := pldShape(events)
	suffix := string(rune('0' + fine))
	bucket := pldMemoKey(hi, delta) + suffix
	p := pldPrepCache.get(bucket)
	if p != nil && !p.wide {
		return p
	}
	shape, key := hi, bucket
	var w pldWindow
	if p == nil {
		w = pldWindowFor(lo, hi, delta, fine)
		if top := pldWindowFor(hi, hi, delta, fine); w.h > 2*top.h {
			pldPrepCache.put(bucket, &pldPrepared{wide: true})
			p = &pldPrepared{wide: true}
		}
	}
	if p != nil { // a wide bucket: every count gets a window of its own
		// Under a key of its own: the count at the bucket's top (a power
		// of two) has the bucket's key, which holds the wide marker.
		shape, key = events, pldMemoKey(events, delta)+suffix+"/own"
		if p := pldPrepCache.get(key); p != nil {
			return p
		}
		w = pldWindowFor(events, events, delta, fine)
	}
	p = &pldPrepared{w: w}
	fft := fourier.NewFFT(w.n)
	seq := make([]float64, w.n)
	coef := make([]complex128, w.n/2+1)
	for _, dir := range []pldDirection{pldRemove, pldAdd} {
		p.steps[dir] = make([]preparedStep, len(shape))
		for i, e := range shape {
			jlo, jhi := w.stepRange(shape, i, dir)
			st := buildStep(dir, e.SampleRate, e.NoiseMultiplier, w.h, jlo, jhi)
			// Tilt: p_k e^{λℓ_k}/Z, folded modulo n.
			ps := preparedStep{logZ: st.tilt(seq, w.lambda, w.h), logFinite: math.Log1p(-st.inf), first: st.first,
				logAbs: make([]float64, len(coef)), phase: make([]float64, len(coef))}
			fft.Coefficients(coef, seq)
			for k, v := range coef {
				ps.logAbs[k], ps.phase[k] = math.Log(cmplx.Abs(v)), cmplx.Phase(v)
			}
			for j, t := range []float64{w.lambda, w.tTop} {
				if t > 0 {
					ps.cgf[j] = st.tilt(nil, t, w.h)
				}
			}
			p.steps[dir][i] = ps
			p.size += 16 * len(coef)
		}
	}
	for _, e := range shape {
		p.rdp = append(p.rdp, subsampledCurve(e.discrete(), e.SampleRate, e.NoiseMultiplier, DefaultOrders()))
	}
	pldPrepCache.put(key, p)
	return p
}

// solve solves (1) for the smallest ε ≥ 0 with δ(ε) ≤ delta, or returns
// ok = false if the window cannot bracket it.
func (c composedPLD) solve(delta float64) (eps float64, ok bool) {
	w, n := c.w, c.w.n
	rest := delta - c.inf
	if !(rest > 0) {
		return 0, false
	}
	// δ(ℓ_i) is non-increasing in i: binary search the last grid point
	// with δ > rest, then solve inside the cell. δ(ℓ_i) = a_i − b_i with
	// a_i = Σ_{k>i} m_k and b_i = Σ_{k>i} m_k e^{ℓ_i−ℓ_k}, the suffix sums
	// compose computed (tails).
	deltaAt := func(i int) (a, b float64) { return c.tailA[i], c.tailB[i] }
	if a, b := deltaAt(0); a-b <= rest {
		return math.Max(float64(w.lo)*w.h, 0), true
	}
	if a, b := deltaAt(n - 1); a-b > rest {
		return 0, false
	}
	lo, hi := 0, n-1 // δ(lo) > rest ≥ δ(hi)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if a, b := deltaAt(mid); a-b > rest {
			lo = mid
		} else {
			hi = mid
		}
	}
	// On (ℓ_lo, ℓ_lo+h], δ(ℓ_lo+u) = A − e^u·B with A, B the sums over
	// k > lo (the mass at ℓ_hi is included: it is > ε there).
	a, b := deltaAt(lo)
	u := w.h
	if b > 0 && a-rest > 0 {
		u = math.Min(math.Max(math.Log((a-rest)/b), 0), w.h)
	}
	return math.Max(float64(w.lo+int64(lo))*w.h+u, 0), true
}

func mod(a, n int64) int64 {
	a %= n
	if a < 0 {
		a += n
	}
	return a
}

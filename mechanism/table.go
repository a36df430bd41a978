package mechanism

import (
	"math"
	"math/big"
	"math/bits"
)

// The table sampler: an exact sampler of N_Z(0, t²) for large t that costs
// about three uniform words per deviate instead of CKS's dozen Bernoulli
// trials. It is rejection sampling from a step envelope over blocks of
// w = 2^e ≤ t/64 consecutive magnitudes, ρ(x) = exp(−x²/(2t²)):
//
//  1. one uniform word picks a column: its top bits a column of Walker's
//     alias table, its low bits the alias threshold, so column i has
//     probability W_i/2^v exactly, for integer weights summing to 2^v.
//     Block b covers the magnitudes [bw, bw + w_b) below T = 8t and has
//     weight W_b = ⌈λ·ρ(bw)·w_b/w⌉ (certified upward rounding,
//     expNegBounds); one column is the tail x ≥ T, with
//     W_tail = ⌈λ·ρ(T)/(w·(1 − e^(−T/t²)))⌉; one column holds the rest of
//     2^v and means "start again"; λ is chosen so that it is tiny;
//  2. in block b, x = bw + a uniform offset, accepted with probability
//     λ·ρ(x)·w_b/(w·W_b) = c_b·exp(−δ), where c_b = λ·ρ(bw)·w_b/(w·W_b) ≤ 1
//     is a per-block constant, drawn as Bernoulli(c_b) by comparing a
//     uniform word with c_b's certified binary digits, and
//     δ = (x − bw)(x + bw)/(2t²) ≤ 1/8 is rational, drawn by CKS
//     Algorithm 1;
//  3. in the tail, x = T + y with y geometric of ratio exp(−T/t²) (from
//     expMagnitude), accepted with probability c_tail·exp(−y²/(2t²)),
//     c_tail = λ·ρ(T)/(w·(1 − e^(−T/t²))·W_tail) ≤ 1;
//  4. a uniform sign, rejecting "−0".
//
// A candidate x has proposal probability P(x) = W_b/(2^v·w_b) in block b
// and W_tail(1 − r)r^y/2^v in the tail (r = e^(−T/t²)), and acceptance
// probability λ·ρ(x)/(2^v·w·P(x)), which is the c·exp(…) of steps 2 and 3,
// so each x is output with probability ∝ ρ(x), exactly. The envelope
// exceeds ρ by about w·x/t²
// within a block, so over 98% of candidates are accepted.

const (
	// minTableScale is the smallest t the table sampler serves (w ≥ 64);
	// smaller scales use CKS Algorithm 3 directly.
	minTableScale = 1 << 12
	// tailFactor places the tail at T = tailFactor·t (ρ(T) = e^(−32)).
	tailFactor = 8
)

// gaussTable is the precomputed envelope for one scale t. It is read-only
// after construction and safe for concurrent use.
type gaussTable struct {
	t      uint64
	d      u128 // 2t²
	e      uint // full blocks are w = 2^e wide
	w      uint64
	factor uint64
	tail   uint64 // T = factor·t
	blocks int    // columns 0..blocks−1 are blocks; then the tail, then "again"
	vBits  uint   // the weights sum to 2^vBits; 64 − vBits bits pick a column
	lambda uint64 // the envelope's scale λ
	weight []uint64
	width  []uint64 // block widths (w, or less for the last block)
	cut    []uint64 // column i keeps threshold draws below cut[i], else alias[i]
	alias  []uint32
	cdig   []uint64 // ⌊2⁶⁴·c_i⌋
	cone   []bool   // c_i = 1 exactly (block 0 only)
	cFast  []bool   // c_i's first 8 binary digits are ones
	// dThr[b] = ⌈2⁸·δ_max⌉ for block b's largest δ: 8 uniform bits at or
	// above it show Bernoulli(δ) false without computing δ's digits.
	dThr []uint64

	// pick is what tableGaussian reads per deviate, packed so that a
	// draw touches one small entry instead of seven arrays: the alias
	// table by column, with the fast-path facts of both blocks the column
	// can give. vMask is 2^vBits − 1.
	pick  []aliasEntry
	vMask uint64
}

// aliasEntry is column i of the alias table: keep i for threshold draws
// below cut, else take alias; self and other are the hot facts of blocks
// i and alias (hotFacts), read without a second, dependent load.
type aliasEntry struct {
	cut         uint64
	alias       uint32
	self, other uint32
}

// The hot facts of a column, packed into a uint32: dThr[b] in the low 16
// bits; hotFast when block b takes tableGaussian's fast path (full width
// w, c_b = 1 or c_b's first 8 binary digits ones, and 2t² < 2⁶³);
// hotCone when c_b = 1. Zero for the tail and "again" columns.
const (
	hotFast = 1 << 16
	hotCone = 1 << 17
)

// hotFacts packs column b's hot facts.
func (g *gaussTable) hotFacts(b int) uint32 {
	if b >= g.blocks {
		return 0
	}
	h := uint32(g.dThr[b])
	if g.d.hi == 0 && g.d.lo < 1<<63 && g.width[b] == g.w && (g.cone[b] || g.cFast[b]) {
		h |= hotFast
	}
	if g.cone[b] {
		h |= hotCone
	}
	return h
}

// newGaussTable builds the table for N_Z(0, t²), t ≥ minTableScale, with
// the tail at T = factor·t (tailFactor in production; tests lower it to
// exercise the tail).
func newGaussTable(t uint64, factor uint64) *gaussTable {
	tt := mul64(t, t)
	g := &gaussTable{t: t, d: u128{tt.hi<<1 | tt.lo>>63, tt.lo << 1}, factor: factor, tail: factor * t}
	g.e = uint(bits.Len64(t/64)) - 1
	g.w = 1 << g.e
	g.blocks = int((g.tail + g.w - 1) / g.w)
	colBits := uint(bits.Len(uint(g.blocks + 1))) // blocks + tail + "again" columns
	g.vBits = 64 - colBits
	n := 1 << colBits
	g.width = make([]uint64, n)
	for b := range g.blocks {
		g.width[b] = min(g.w, g.tail-uint64(b)*g.w)
	}
	// λ so that the weights sum to just under 2^vBits: the envelope's mass
	// (float64 estimate) times λ, plus one per column for the rounding up.
	mass := 0.0
	for b := range g.blocks {
		x := float64(uint64(b) * g.w)
		mass += math.Exp(-x*x/(2*float64(t)*float64(t))) * float64(g.width[b]) / float64(g.w)
	}
	mass += math.Exp(-float64(factor*factor)/2) / (float64(g.w) * -math.Expm1(-float64(factor)/float64(t)))
	lambda := math.Ldexp(1, int(g.vBits)) * (1 - 0x1p-16) / mass
	for {
		g.lambda = uint64(lambda) - uint64(n)
		if total, ok := g.weigh(n); ok {
			g.weight[g.blocks+1] = 1<<g.vBits - total // "again"
			break
		}
		lambda *= 1 - 0x1p-12 // the estimate was off: shrink λ
	}
	g.cdig = make([]uint64, n)
	g.cone = make([]bool, n)
	g.cFast = make([]bool, n)
	g.cone[0] = true // ρ(0) = 1, w_0 = w: W_0 = λ and c_0 = 1
	for i := 1; i <= g.blocks; i++ {
		g.cdig[i] = g.cDigits(i, 64).Uint64()
		g.cFast[i] = g.cdig[i]>>56 == 0xff
	}
	g.dThr = make([]uint64, g.blocks)
	d := new(big.Int).Lsh(new(big.Int).SetUint64(g.d.hi), 64)
	d.Or(d, new(big.Int).SetUint64(g.d.lo))
	for b := range g.blocks {
		// δ_max = (w_b − 1)(2bw + w_b − 1)/(2t²); ⌈2⁸·δ_max⌉.
		num := new(big.Int).SetUint64(g.width[b] - 1)
		num.Mul(num, new(big.Int).SetUint64(2*uint64(b)*g.w+g.width[b]-1))
		num.Lsh(num, 8)
		q, r := num.QuoRem(num, d, new(big.Int))
		if r.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		g.dThr[b] = min(q.Uint64(), 256)
	}
	g.buildAlias(n)
	g.pack(n)
	return g
}

// pack fills pick and vMask from the table's arrays.
func (g *gaussTable) pack(n int) {
	g.vMask = 1<<g.vBits - 1
	g.pick = make([]aliasEntry, n)
	for i := range g.pick {
		g.pick[i] = aliasEntry{cut: g.cut[i], alias: g.alias[i],
			self: g.hotFacts(i), other: g.hotFacts(int(g.alias[i]))}
	}
}

// weigh sets the block and tail weights for g.lambda and returns their sum,
// or false if it exceeds 2^vBits.
func (g *gaussTable) weigh(n int) (uint64, bool) {
	g.weight = make([]uint64, n)
	lam := new(big.Int).SetUint64(g.lambda)
	const p = 128
	for b := range g.blocks {
		if b == 0 {
			g.weight[0] = g.lambda // ρ(0) = 1 exactly and w_0 = w
			continue
		}
		// W_b = ⌈λ·ρ(bw)·w_b/w⌉ from an upper bound of 2^p·ρ(bw).
		_, hi := g.rho(uint64(b)*g.w, p)
		hi.Mul(hi, lam)
		g.weight[b] = ceilShift(hi.Mul(hi, new(big.Int).SetUint64(g.width[b])), p+g.e)
	}
	// W_tail = ⌈λ·ρ(T)/(w(1 − r))⌉, r = exp(−T/t²), from upper bounds of
	// ρ(T) and of r.
	_, rhoHi := g.rho(g.tail, p)
	_, rHi := g.tailRatio(p)
	num := rhoHi.Mul(rhoHi, lam)
	den := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), p), rHi)
	den.Mul(den, new(big.Int).SetUint64(g.w))
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	g.weight[g.blocks] = max(q.Uint64(), 1)
	var total uint64
	for _, w := range g.weight {
		var carry uint64
		total, carry = bits.Add64(total, w, 0)
		if carry != 0 || total > 1<<g.vBits {
			return 0, false
		}
	}
	return total, true
}

// tailRatio bounds 2^p·r, r = exp(−T/t²), the tail's geometric ratio.
func (g *gaussTable) tailRatio(p uint) (lo, hi *big.Int) {
	t := new(big.Int).SetUint64(g.t)
	return expNegBounds(new(big.Int).SetUint64(g.tail), t.Mul(t, t), p)
}

// rho bounds 2^p·exp(−x²/(2t²)).
func (g *gaussTable) rho(x uint64, p uint) (lo, hi *big.Int) {
	n := new(big.Int).SetUint64(x)
	n.Mul(n, n)
	d := new(big.Int).Lsh(new(big.Int).SetUint64(g.d.hi), 64)
	d.Or(d, new(big.Int).SetUint64(g.d.lo))
	return expNegBounds(n, d, p)
}

// ceilShift returns ⌈x/2^s⌉.
func ceilShift(x *big.Int, s uint) uint64 {
	y := new(big.Int).Add(x, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), s), big.NewInt(1)))
	return y.Rsh(y, s).Uint64()
}

// cDigits returns ⌊2^k·c_i⌋ exactly, for a block i ≥ 1 or the tail: it
// bounds c_i at increasing precision until both bounds have the same
// floor, which happens because c_i is irrational (exp of a non-zero
// rational, times rationals).
func (g *gaussTable) cDigits(i int, k uint) *big.Int {
	lam := new(big.Int).SetUint64(g.lambda)
	for p := k + 64; ; p += 64 {
		var lo, hi *big.Int
		if i < g.blocks {
			// c_b = λ·ρ(bw)·w_b/(w·W_b), w = 2^e.
			rLo, rHi := g.rho(uint64(i)*g.w, p)
			scale := new(big.Int).Mul(lam, new(big.Int).SetUint64(g.width[i]))
			den := new(big.Int).SetUint64(g.weight[i])
			den.Lsh(den, p+g.e-k)
			lo = new(big.Int).Quo(rLo.Mul(rLo, scale), den)
			hi = new(big.Int).Quo(rHi.Mul(rHi, scale), den)
		} else {
			// c_tail = λ·ρ(T)/(w·(1 − r)·W_tail):
			// 2^k·c ∈ [2^k·λ·rLo/(w·W·(2^p − qLo)), 2^k·λ·rHi/(w·W·(2^p − qHi))].
			rLo, rHi := g.rho(g.tail, p)
			qLo, qHi := g.tailRatio(p)
			one := new(big.Int).Lsh(big.NewInt(1), p)
			wW := new(big.Int).SetUint64(g.weight[i])
			wW.Mul(wW, new(big.Int).SetUint64(g.w))
			lo = new(big.Int).Lsh(rLo.Mul(rLo, lam), k)
			lo.Quo(lo, new(big.Int).Mul(wW, new(big.Int).Sub(one, qLo)))
			hi = new(big.Int).Lsh(rHi.Mul(rHi, lam), k)
			hi.Quo(hi, new(big.Int).Mul(wW, new(big.Int).Sub(one, qHi)))
		}
		if lo.Cmp(hi) == 0 {
			return lo
		}
	}
}

// buildAlias builds Walker's alias table for the n integer weights
// summing to 2^vBits (Vose's construction in exact integer arithmetic):
// each column holds 2^vBits units, and column i keeps n·W_i units overall.
func (g *gaussTable) buildAlias(n int) {
	total := uint64(1) << g.vBits
	mass := make([]uint64, n)
	var small, large []int
	for i, w := range g.weight {
		mass[i] = w * uint64(n) // < 2⁶⁴: W_i < 2^vBits = 2⁶⁴/n
		if mass[i] < total {
			small = append(small, i)
		} else {
			large = append(large, i)
		}
	}
	g.cut = make([]uint64, n)
	g.alias = make([]uint32, n)
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		g.cut[s], g.alias[s] = mass[s], uint32(l)
		mass[l] -= total - mass[s]
		if mass[l] < total {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	for _, i := range append(small, large...) {
		g.cut[i], g.alias[i] = total, uint32(i)
	}
}

// tableGaussian draws z ~ N_Z(0, t²) from the table (steps 1–4 above). It
// returns z, or, when |z| ≥ s.limit, z in big.
//
// The common case, a block on the fast path (hotFast), is written out
// here with the bit buffer's take inlined; every other case is
// tableBlock or tableTail. Both read the same bits in the same order
// (TestTableStreamPinned): one word for the column, then e + 17 bits for
// the offset, 8 bits for Bernoulli(c_b), 8 for Bernoulli(δ) and the sign.
func (s *sampler) tableGaussian(g *gaussTable) (int64, *big.Int) {
	for {
		r := s.bits.word()
		i := uint32(r >> g.vBits)
		p := &g.pick[i]
		// i, or p.alias when the threshold draw is at or above p.cut,
		// without a branch (the choice is close to a coin flip in many
		// columns): both are below 2⁶³, so the difference's top bit says
		// "below".
		keep := uint32((r&g.vMask-p.cut)>>63) - 1 // 0: below cut, keep i; all ones: alias
		i = i&^keep | p.alias&keep
		h := p.self&^keep | p.other&keep
		if int(i) >= g.blocks {
			if int(i) > g.blocks {
				continue // "again"
			}
			if z, bigZ, ok := s.tableTail(g); ok {
				return z, bigZ
			}
			continue
		}
		if h&hotFast == 0 {
			if x, neg, ok := s.tableBlock(g, int(i)); ok {
				return signed(x, neg), nil
			}
			continue
		}
		n := g.e + 17
		var v uint64
		if n <= s.bits.n {
			v = s.bits.buf & (1<<n - 1)
			s.bits.buf >>= n
			s.bits.n -= n
		} else {
			v = s.bits.takeRefill(n)
		}
		off := v & (g.w - 1)
		v >>= g.e
		if v&0xff == 0xff && h&hotCone == 0 && !s.bernoulliC(g, int(i), 0xff) {
			continue
		}
		// Bernoulli(exp(−δ)), δ = off·(x + bw)/(2t²) < 2⁶³ (tableBlock).
		base := uint64(i) << g.e
		x := base + off
		if dv, thr := v>>8&0xff, uint64(h&0xffff); dv < thr && !s.acceptSmall(off*(x+base), g.d.lo, thr, dv) {
			continue
		}
		// The sign without a branch (a coin flip): x, or −x when the sign
		// bit is 1, rejecting "−0".
		neg := int64(v >> 16)
		if x == 0 && neg == 1 {
			continue
		}
		return int64(x) ^ -neg + neg, nil
	}
}

// signed is x with the sign neg.
func signed(x uint64, neg bool) int64 {
	if neg {
		return -int64(x)
	}
	return int64(x)
}

// tableBlock finishes a candidate in block i (step 2) off the fast path: a
// narrower last block, a c_i whose first 8 digits are not all ones, or
// 2t² ≥ 2⁶³. It returns the magnitude and sign, or false for a rejection
// (or "−0").
func (s *sampler) tableBlock(g *gaussTable, i int) (x uint64, neg, ok bool) {
	// One read of e+17 bits: the offset, 8 bits for Bernoulli(c_b), 8 for
	// Bernoulli(δ), the sign (e ≤ 42 for t ≤ 2⁴⁸).
	base := uint64(i) << g.e
	var off, r uint64
	if g.width[i] == g.w {
		r = s.bits.take(g.e + 17)
		off, r = r&(g.w-1), r>>g.e
	} else {
		off, r = s.below(g.width[i]), s.bits.take(17)
	}
	neg = r>>16 == 1
	if !s.bernoulliC(g, i, r&0xff) {
		return 0, false, false
	}
	// Bernoulli(exp(−δ)), δ = (x − bw)(x + bw)/(2t²) ≤ 1/8 (CKS
	// Algorithm 1): its first Bernoulli(δ) decides with probability
	// 1 − δ, mostly from 8 bits (dThr).
	x = base + off
	delta := mul64(off, x+base)
	if g.d.hi == 0 && g.d.lo < 1<<63 {
		if !s.acceptSmall(delta.lo, g.d.lo, g.dThr[i], r>>8&0xff) {
			return 0, false, false
		}
	} else if !s.bernoulliExpFrac(delta, g.d) {
		return 0, false, false
	}
	return x, neg, !(neg && x == 0)
}

// tableTail finishes a candidate in the tail (step 3): z, or z in big
// when |z| ≥ s.limit, or false for a rejection.
func (s *sampler) tableTail(g *gaussTable) (int64, *big.Int, bool) {
	y, bigY := s.expMagnitude(g.t)
	if bigY != nil || y/g.factor >= s.limit-g.tail {
		z, ok := s.tailBig(g, y, bigY)
		return 0, z, ok
	}
	y /= g.factor // geometric with ratio exp(−T/t²)
	if !s.bernoulliExp(mul64(y, y), g.d) || !s.bernoulliC(g, g.blocks, s.bits.take(8)) {
		return 0, nil, false
	}
	return signed(g.tail+y, s.bits.bit()), nil, true
}

// bernoulliC returns true with probability c_i, given 8 uniform bits v
// taken as U's first binary digits: where c_i's first 8 digits are ones,
// v ≠ 0xff decides U < c_i. Otherwise it compares U's first 64 digits (v
// and 56 more bits, or a fresh word) with c_i's, and, on a tie (probability
// 2⁻⁶⁴), each next word with the next 64 digits, computed exactly
// (cDigits): U < c_i at the first word where they differ.
func (s *sampler) bernoulliC(g *gaussTable, i int, v uint64) bool {
	if g.cone[i] {
		return true
	}
	var u uint64
	if g.cFast[i] {
		if v != 0xff {
			return true
		}
		u = v<<56 | s.bits.take(56)
	} else {
		u = s.bits.word() // v unused: independent of the decision
	}
	if u != g.cdig[i] {
		return u < g.cdig[i]
	}
	mask := new(big.Int).SetUint64(^uint64(0))
	for k := uint(128); ; k += 64 {
		block := new(big.Int).And(g.cDigits(i, k), mask).Uint64()
		if u := s.bits.word(); u != block {
			return u < block
		}
	}
}

// tailBig finishes a tail candidate whose magnitude leaves the fast range
// (in practice never): y = ⌊X/factor⌋ for the one-sided exponential draw
// X (x, or xBig), accepted with probability exp(−y²/(2t²))·c_tail, in
// math/big. It returns ±(T + y) and true, or false for a rejection.
func (s *sampler) tailBig(g *gaussTable, x uint64, xBig *big.Int) (*big.Int, bool) {
	if xBig == nil {
		xBig = new(big.Int).SetUint64(x)
	}
	y := new(big.Int).Quo(xBig, new(big.Int).SetUint64(g.factor))
	n := new(big.Int).Mul(y, y)
	d := new(big.Int).Lsh(new(big.Int).SetUint64(g.d.hi), 64)
	d.Or(d, new(big.Int).SetUint64(g.d.lo))
	q, r := new(big.Int).QuoRem(n, d, new(big.Int))
	for one := big.NewInt(1); q.Sign() > 0; q.Sub(q, one) {
		if !s.bernoulliExpOne() {
			return nil, false
		}
	}
	rem := u128{new(big.Int).Rsh(r, 64).Uint64(), new(big.Int).And(r, new(big.Int).SetUint64(^uint64(0))).Uint64()}
	if !s.bernoulliExpFrac(rem, g.d) || !s.bernoulliC(g, g.blocks, s.bits.take(8)) {
		return nil, false
	}
	z := y.Add(y, new(big.Int).SetUint64(g.tail))
	if s.bits.bit() {
		z.Neg(z)
	}
	return z, true
}

// acceptSmall returns true with probability exp(−n/d), n < d < 2⁶³,
// n/d ≤ thr/2⁸ (CKS Algorithm 1), given 8 uniform bits v. Its first trial,
// Bernoulli(n/d), takes v as U's first digits: v ≥ thr means U ≥ n/d
// (false, so accept); otherwise U's first 64 digits (v and 56 more bits)
// are compared with the first 64 digits of n/d (one division), and on a
// tie the rest digit by digit.
func (s *sampler) acceptSmall(n, d, thr, v uint64) bool {
	if n == 0 || v >= thr {
		return true
	}
	q, r := bits.Div64(n, 0, d)
	u := v<<56 | s.bits.take(56)
	if u > q || u == q && (r == 0 || !s.bernoulli64(r, d)) {
		return true // the first Bernoulli(n/d) failed: K = 1
	}
	k := uint64(2)
	for s.oneIn(k) && s.bernoulli64(n, d) {
		k++
	}
	return k%2 == 1
}

package privacyaudit

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Guess makes the auditor's guesses and counts the correct ones, as in
// the paper's Algorithm 1 (its guessing step): the canaries are ranked by
// score, highest first; the kPlus highest are guessed included, the kMinus
// lowest guessed excluded, the rest abstain. It returns r = kPlus + kMinus
// and v, the number of guesses that match included (included[i] reports
// whether canary i was in the training run; scores[i] is the auditor's
// score for canary i, higher meaning "more likely included").
//
// Ties are broken by index: the ranking is the one total order "score
// descending, then index ascending", so among equal scores the lower
// index is guessed included first and the higher index guessed excluded
// first. The order does not depend on included, so the guesses remain a
// function of the scores alone, as Theorem 3.1 requires. ±Inf scores are
// ordinary values.
//
// kPlus and kMinus must be fixed before the scores are seen: choosing them
// after (the best of several splits, say) invalidates the bound unless the
// choice is paid for, e.g. by dividing β by the number of splits tried.
//
// It returns ErrInvalid for len(scores) ≠ len(included), kPlus or kMinus
// negative, kPlus + kMinus > len(scores), or a NaN score. It does not
// modify its arguments.
func Guess(scores []float64, included []bool, kPlus, kMinus int) (r, v int, err error) {
	n := len(scores)
	switch {
	case len(included) != n:
		return 0, 0, fmt.Errorf("%w: %d scores but %d inclusion flags", ErrInvalid, n, len(included))
	case kPlus < 0 || kMinus < 0 || kPlus > n || kMinus > n-kPlus:
		return 0, 0, fmt.Errorf("%w: kPlus = %d, kMinus = %d guesses among %d canaries, want both ≥ 0 with sum ≤ %d", ErrInvalid, kPlus, kMinus, n, n)
	}
	for i, s := range scores {
		if math.IsNaN(s) {
			return 0, 0, fmt.Errorf("%w: score %d is NaN", ErrInvalid, i)
		}
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(scores[b], scores[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	for _, i := range order[:kPlus] {
		if included[i] {
			v++
		}
	}
	for _, i := range order[n-kMinus:] {
		if !included[i] {
			v++
		}
	}
	return kPlus + kMinus, v, nil
}

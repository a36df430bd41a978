package dataset

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"gonum.org/v1/gonum/stat/distuv"
)

// newRand returns the package's deterministic generator for a seed.
// Splits, shards and synthetic data are reproducible, not secret: nothing
// here draws the private per-step sample (that is package sampling).
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// Split shuffles d's rows with a generator seeded by seed and returns two
// new datasets: test holds round(testFraction·Len()) rows, train the rest.
// testFraction must be in (0, 1) and both parts must be non-empty.
// Rows keep their original relative order within each part. The result is
// deterministic in (d, testFraction, seed).
func Split(d *Dataset, testFraction float64, seed uint64) (train, test *Dataset, err error) {
	if !(testFraction > 0 && testFraction < 1) {
		return nil, nil, fmt.Errorf("dataset: Split: testFraction %v not in (0, 1)", testFraction)
	}
	n := d.Len()
	nt := int(math.Round(testFraction * float64(n)))
	if nt == 0 || nt == n {
		return nil, nil, fmt.Errorf("dataset: Split: %d rows with testFraction %v leaves an empty part", n, testFraction)
	}
	perm := newRand(seed).Perm(n)
	testIdx, trainIdx := perm[:nt], perm[nt:]
	slices.Sort(testIdx)
	slices.Sort(trainIdx)
	train, test = d.Subset(trainIdx), d.Subset(testIdx)
	train.Name, test.Name = d.Name+"-train", d.Name+"-test"
	return train, test, nil
}

// ShardSizeIID is the number of rows of shard s of ShardIndicesIID(n, k,
// ·): n/k, one more for the first n mod k shards. It requires k ≥ 1.
func ShardSizeIID(n int64, k, s int) int64 {
	size := n / int64(k)
	if int64(s) < n%int64(k) {
		size++
	}
	return size
}

// ShardIndicesIID partitions [0, n) into k shards uniformly at random:
// a seeded permutation cut into k contiguous pieces whose sizes differ by
// at most one (the first n mod k shards get the extra row). Indices within
// a shard are increasing. It requires 1 ≤ k ≤ n.
func ShardIndicesIID(n, k int, seed uint64) ([][]int, error) {
	if k < 1 || k > n {
		return nil, fmt.Errorf("dataset: cannot cut %d rows into %d non-empty shards", n, k)
	}
	perm := newRand(seed).Perm(n)
	out := make([][]int, k)
	start := 0
	for s := range k {
		size := int(ShardSizeIID(int64(n), k, s))
		out[s] = perm[start : start+size : start+size]
		slices.Sort(out[s])
		start += size
	}
	return out, nil
}

// ShardIID splits d into k IID shards (see ShardIndicesIID), named
// "<name>-shard<i>". The shards partition d's rows exactly.
func ShardIID(d *Dataset, k int, seed uint64) ([]*Dataset, error) {
	idx, err := ShardIndicesIID(d.Len(), k, seed)
	if err != nil {
		return nil, err
	}
	return subsets(d, idx), nil
}

// ShardIndicesLabelSkew partitions [0, len(labels)) into k shards whose
// label distributions differ, by the Dirichlet scheme of Hsu, Qi and Brown
// 2019 ("Measuring the effects of non-identical data distribution for
// federated visual classification", arXiv:1909.06335): for every class c,
// draw proportions p_c ~ Dirichlet(α, ..., α) over the k shards and deal
// c's examples (in seeded random order) to the shards in those
// proportions, rounding the cumulative counts. Small α (0.1) gives shards
// dominated by a few classes; large α (100) approaches IID. If a shard ends
// up empty, it takes one example from the currently largest shard, so
// every shard is non-empty. Labels must lie in [0, classes); it requires
// 1 ≤ k ≤ len(labels) and α > 0. Indices within a shard are increasing.
func ShardIndicesLabelSkew(labels []int32, classes, k int, alpha float64, seed uint64) ([][]int, error) {
	n := len(labels)
	if k < 1 || k > n {
		return nil, fmt.Errorf("dataset: cannot cut %d rows into %d non-empty shards", n, k)
	}
	if !(alpha > 0) || math.IsInf(alpha, 1) {
		return nil, fmt.Errorf("dataset: Dirichlet concentration α = %v must be positive and finite", alpha)
	}
	if classes < 1 {
		return nil, fmt.Errorf("dataset: %d classes", classes)
	}
	byClass := make([][]int, classes)
	for i, y := range labels {
		if y < 0 || int(y) >= classes {
			return nil, fmt.Errorf("%w: row %d: label %d outside [0, %d)", ErrInvalid, i, y, classes)
		}
		byClass[y] = append(byClass[y], i)
	}
	r := newRand(seed)
	gamma := distuv.Gamma{Alpha: alpha, Beta: 1, Src: r}
	out := make([][]int, k)
	props := make([]float64, k)
	for _, members := range byClass {
		if len(members) == 0 {
			continue
		}
		r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		// Dirichlet(α·1) = normalized independent Gamma(α, 1) draws.
		sum := 0.0
		for s := range props {
			props[s] = gamma.Rand()
			sum += props[s]
		}
		if !(sum > 0) || math.IsInf(sum, 0) {
			// Every Gamma draw underflowed (tiny α): the Dirichlet's
			// limit puts all mass on one uniformly chosen shard.
			clear(props)
			props[r.IntN(k)], sum = 1, 1
		}
		cum, start := 0.0, 0
		for s := range k {
			cum += props[s]
			end := int(math.Round(cum / sum * float64(len(members))))
			if s == k-1 {
				end = len(members)
			}
			end = max(end, start)
			out[s] = append(out[s], members[start:end]...)
			start = end
		}
	}
	for s := range out {
		if len(out[s]) > 0 {
			continue
		}
		big := 0
		for t := range out {
			if len(out[t]) > len(out[big]) {
				big = t
			}
		}
		last := len(out[big]) - 1
		out[s] = append(out[s], out[big][last])
		out[big] = out[big][:last]
	}
	for s := range out {
		slices.Sort(out[s])
	}
	return out, nil
}

// ShardLabelSkew splits d into k label-skewed shards (see
// ShardIndicesLabelSkew), named "<name>-shard<i>". The shards partition d's
// rows exactly.
func ShardLabelSkew(d *Dataset, k int, alpha float64, seed uint64) ([]*Dataset, error) {
	idx, err := ShardIndicesLabelSkew(d.Y, d.Classes, k, alpha, seed)
	if err != nil {
		return nil, err
	}
	return subsets(d, idx), nil
}

func subsets(d *Dataset, idx [][]int) []*Dataset {
	out := make([]*Dataset, len(idx))
	for s, ix := range idx {
		out[s] = d.Subset(ix)
		out[s].Name = fmt.Sprintf("%s-shard%d", d.Name, s)
	}
	return out
}

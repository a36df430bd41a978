package dataset

import (
	"errors"
	"math"
	"slices"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

func TestGaussianMixture(t *testing.T) {
	d, err := GaussianMixture(3000, 5, 3, 6, 11)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if d.Len() != 3000 || d.Dim != 5 || d.Classes != 3 {
		t.Fatalf("got %d×%d, %d classes", d.Len(), d.Dim, d.Classes)
	}
	again, _ := GaussianMixture(3000, 5, 3, 6, 11)
	if !slices.Equal(d.X, again.X) || !slices.Equal(d.Y, again.Y) {
		t.Fatal("not deterministic")
	}
	other, _ := GaussianMixture(3000, 5, 3, 6, 12)
	if slices.Equal(d.X, other.X) {
		t.Fatal("seed ignored")
	}
	// Well separated: nearest class mean (estimated from the data) is right
	// almost always; with separation 0 it is near chance.
	if acc := nearestMeanAccuracy(d, d); acc < 0.97 {
		t.Fatalf("separation 6: nearest-mean accuracy %.3f, want ≥ 0.97", acc)
	}
	noise, _ := GaussianMixture(3000, 5, 3, 0, 11)
	if acc := nearestMeanAccuracy(noise, noise); acc > 0.45 {
		t.Fatalf("separation 0: nearest-mean accuracy %.3f, want ≈ 1/3", acc)
	}
	for _, bad := range [][4]float64{{-1, 2, 2, 1}, {10, 0, 2, 1}, {10, 2, 0, 1}, {10, 2, 2, -1}, {10, 2, 2, math.NaN()}} {
		if _, err := GaussianMixture(int(bad[0]), int(bad[1]), int(bad[2]), bad[3], 1); err == nil {
			t.Errorf("GaussianMixture%v accepted", bad)
		}
	}
}

// nearestMeanAccuracy fits class means on train and classifies test by the
// nearest mean: a linear classifier (argmax_k μ_k·x − |μ_k|²/2). Test rows
// whose class never occurs in train are skipped.
func nearestMeanAccuracy(train, test *Dataset) float64 {
	dim, k := train.Dim, train.Classes
	mean := make([]float64, k*dim)
	count := make([]int, k)
	for i := range train.Len() {
		c := int(train.Y[i])
		count[c]++
		for j, v := range train.Row(i) {
			mean[c*dim+j] += float64(v)
		}
	}
	for c := range k {
		for j := range dim {
			if count[c] > 0 {
				mean[c*dim+j] /= float64(count[c])
			}
		}
	}
	right, total := 0, 0
	for i := range test.Len() {
		if count[test.Y[i]] == 0 {
			continue
		}
		best, bestD := -1, math.Inf(1)
		for c := range k {
			if count[c] == 0 {
				continue
			}
			dd := 0.0
			for j, v := range test.Row(i) {
				e := float64(v) - mean[c*dim+j]
				dd += e * e
			}
			if dd < bestD {
				best, bestD = c, dd
			}
		}
		total++
		if best == int(test.Y[i]) {
			right++
		}
	}
	return float64(right) / float64(total)
}

func TestZipfProbabilities(t *testing.T) {
	p := ZipfProbabilities(1000, 1)
	sum := 0.0
	for k, pk := range p {
		sum += pk
		// p_k / p_1 = 1/k.
		if got, want := pk/p[0], 1/float64(k+1); math.Abs(got-want) > 1e-12 {
			t.Fatalf("p_%d/p_1 = %v, want %v", k+1, got, want)
		}
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Fatalf("sum = %v", sum)
	}
	for _, pk := range ZipfProbabilities(7, 0) {
		if math.Abs(pk-1.0/7) > 1e-15 {
			t.Fatalf("s=0 not uniform: %v", pk)
		}
	}
}

func TestZipfClasses(t *testing.T) {
	cfg := DefaultZipfConfig()
	d, err := ZipfClasses(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if d.Len() != cfg.N || d.Dim != cfg.Dim || d.Classes != cfg.Classes {
		t.Fatalf("got %d×%d, %d classes", d.Len(), d.Dim, d.Classes)
	}
	again, _ := ZipfClasses(cfg)
	if !slices.Equal(d.X, again.X) || !slices.Equal(d.Y, again.Y) {
		t.Fatal("not deterministic")
	}
	// Class frequencies follow the Zipf law: chi-square goodness of fit
	// over the head classes 0..49 plus one pooled tail bin, alpha = 1e-4
	// (fixed seed, so deterministic).
	p := ZipfProbabilities(cfg.Classes, cfg.Exponent)
	counts := make([]float64, cfg.Classes)
	for _, y := range d.Y {
		counts[y]++
	}
	const head = 50
	stat, tailObs, tailExp := 0.0, 0.0, 0.0
	for k := range cfg.Classes {
		exp := p[k] * float64(cfg.N)
		if k < head {
			stat += (counts[k] - exp) * (counts[k] - exp) / exp
		} else {
			tailObs += counts[k]
			tailExp += exp
		}
	}
	stat += (tailObs - tailExp) * (tailObs - tailExp) / tailExp
	if crit := (distuv.ChiSquared{K: head}).Quantile(1 - 1e-4); stat > crit {
		t.Fatalf("class frequencies: chi-square %.1f > %.1f", stat, crit)
	}
	// Heavy tail: class 0 holds ≈ 1/H_1000 ≈ 13%, and most classes are rare.
	if frac := counts[0] / float64(cfg.N); math.Abs(frac-p[0]) > 0.01 {
		t.Fatalf("class 0 frequency %.3f, want ≈ %.3f", frac, p[0])
	}
	rare := 0
	for _, c := range counts {
		if c < 20 {
			rare++
		}
	}
	if rare < cfg.Classes/2 {
		t.Fatalf("only %d of %d classes have < 20 examples; not heavy-tailed", rare, cfg.Classes)
	}
	// Linearly learnable: the nearest-mean (linear) rule fitted on a train
	// split classifies held-out examples of seen classes well.
	train, test, err := Split(d, 0.2, 1)
	if err != nil {
		t.Fatal(err)
	}
	// 500 held-out rows keep the test fast under -race.
	first := make([]int, 500)
	for i := range first {
		first[i] = i
	}
	acc := nearestMeanAccuracy(train, test.Subset(first))
	t.Logf("nearest-mean accuracy on 500 held-out rows: %.3f", acc)
	if acc < 0.9 {
		t.Fatalf("nearest-mean accuracy %.3f, want ≥ 0.9", acc)
	}

	bad := cfg
	bad.Exponent = math.NaN()
	bad.Classes = 0
	if _, err := ZipfClasses(bad); err == nil {
		t.Fatal("invalid config accepted")
	}
}

func TestFromTokens(t *testing.T) {
	docs := [][]int32{{1, 2, 3, 4, 5}, {7}, {}}
	d, err := FromTokens(docs, []int32{0, 1, 1}, 3, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := d.X, []float32{1, 2, 3, 7, -1, -1, -1, -1, -1}; !slices.Equal(got, want) {
		t.Fatalf("X = %v, want %v", got, want)
	}
	if !slices.Equal(d.Shape, []int{3}) || d.Vocab != 8 || d.Dim != 3 || d.Classes != 2 {
		t.Fatalf("metadata: shape %v vocab %d dim %d classes %d", d.Shape, d.Vocab, d.Dim, d.Classes)
	}
	docs[0][0] = 6
	if d.X[0] != 1 {
		t.Fatal("FromTokens retains its input")
	}
	big, err := FromTokens([][]int32{{MaxTokenID - 1}}, []int32{0}, 1, MaxTokenID, 1)
	if err != nil || big.X[0] != MaxTokenID-1 || big.Validate() != nil {
		t.Fatalf("largest id not exact: %v, %v", err, big)
	}
	for _, tc := range []struct {
		docs                   [][]int32
		labels                 []int32
		maxLen, vocab, classes int
	}{
		{[][]int32{{8}}, []int32{0}, 3, 8, 2},
		{[][]int32{{-1}}, []int32{0}, 3, 8, 2},
		{[][]int32{{1}}, []int32{2}, 3, 8, 2},
		{[][]int32{{1}}, []int32{0, 1}, 3, 8, 2},
		{[][]int32{{1}}, []int32{0}, 0, 8, 2},
		{[][]int32{{1}}, []int32{0}, 3, MaxTokenID + 1, 2},
	} {
		if _, err := FromTokens(tc.docs, tc.labels, tc.maxLen, tc.vocab, tc.classes); !errors.Is(err, ErrInvalid) {
			t.Errorf("FromTokens(%v, %v, %d, %d, %d) error = %v, want ErrInvalid", tc.docs, tc.labels, tc.maxLen, tc.vocab, tc.classes, err)
		}
	}
}

package dataset

import (
	"math"
	"slices"
	"testing"
)

// checkPartition asserts that shards partition [0, n) exactly.
func checkPartition(t *testing.T, shards [][]int, n int) {
	t.Helper()
	seen := make([]int, n)
	for s, sh := range shards {
		if len(sh) == 0 {
			t.Fatalf("shard %d is empty", s)
		}
		if !slices.IsSorted(sh) {
			t.Fatalf("shard %d not increasing", s)
		}
		for _, i := range sh {
			if i < 0 || i >= n {
				t.Fatalf("shard %d: index %d out of [0, %d)", s, i, n)
			}
			seen[i]++
		}
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("index %d appears in %d shards, want exactly 1", i, c)
		}
	}
}

func TestShardIndicesIID(t *testing.T) {
	for _, tc := range []struct{ n, k int }{{10, 1}, {10, 3}, {10, 10}, {1000, 7}} {
		sh, err := ShardIndicesIID(tc.n, tc.k, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(sh) != tc.k {
			t.Fatalf("n=%d k=%d: %d shards", tc.n, tc.k, len(sh))
		}
		checkPartition(t, sh, tc.n)
		for s, x := range sh {
			want := tc.n / tc.k
			if s < tc.n%tc.k {
				want++
			}
			if got := len(x); got != want {
				t.Fatalf("n=%d k=%d: shard %d has %d rows, want %d", tc.n, tc.k, s, got, want)
			}
		}
		again, _ := ShardIndicesIID(tc.n, tc.k, 5)
		if !slices.EqualFunc(sh, again, slices.Equal) {
			t.Fatal("not deterministic")
		}
	}
	a, _ := ShardIndicesIID(1000, 2, 1)
	b, _ := ShardIndicesIID(1000, 2, 2)
	if slices.Equal(a[0], b[0]) {
		t.Fatal("seed ignored")
	}
	for _, k := range []int{0, -1, 11} {
		if _, err := ShardIndicesIID(10, k, 1); err == nil {
			t.Fatalf("k=%d accepted for n=10", k)
		}
	}
}

func TestShardIIDDatasets(t *testing.T) {
	d, err := GaussianMixture(101, 3, 4, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	shards, err := ShardIID(d, 4, 9)
	if err != nil {
		t.Fatal(err)
	}
	// Rows in the shards are exactly d's rows: match them back by content.
	rows := map[[4]float32]int{}
	for i := range d.Len() {
		r := d.Row(i)
		rows[[4]float32{r[0], r[1], r[2], float32(d.Y[i])}]++
	}
	total := 0
	for s, sh := range shards {
		if err := sh.Validate(); err != nil {
			t.Fatal(err)
		}
		if sh.Name != "gaussian-mixture-4c-shard"+string(rune('0'+s)) {
			t.Fatalf("shard name %q", sh.Name)
		}
		for i := range sh.Len() {
			r := sh.Row(i)
			key := [4]float32{r[0], r[1], r[2], float32(sh.Y[i])}
			if rows[key] == 0 {
				t.Fatalf("shard %d row %d not in the source (or duplicated)", s, i)
			}
			rows[key]--
			total++
		}
	}
	if total != d.Len() {
		t.Fatalf("shards hold %d rows, want %d", total, d.Len())
	}
}

func TestShardIndicesLabelSkew(t *testing.T) {
	const n, classes, k = 5000, 10, 5
	labels := make([]int32, n)
	for i := range labels {
		labels[i] = int32(i % classes)
	}
	// skewness: mean over shards of the largest class share.
	skew := func(sh [][]int) float64 {
		tot := 0.0
		for _, s := range sh {
			counts := make([]int, classes)
			for _, i := range s {
				counts[labels[i]]++
			}
			tot += float64(slices.Max(counts)) / float64(len(s))
		}
		return tot / float64(len(sh))
	}
	var skews []float64
	for _, alpha := range []float64{0.05, 1, 1000} {
		sh, err := ShardIndicesLabelSkew(labels, classes, k, alpha, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(sh) != k {
			t.Fatalf("α=%v: %d shards", alpha, len(sh))
		}
		checkPartition(t, sh, n)
		skews = append(skews, skew(sh))
	}
	// Smaller α means more skew; α=1000 is close to IID (largest share ≈ 1/10).
	if !(skews[0] > skews[1] && skews[1] > skews[2]) {
		t.Fatalf("skew not decreasing in α: %v", skews)
	}
	if skews[0] < 0.5 {
		t.Fatalf("α=0.05: mean largest-class share %.2f, want ≥ 0.5", skews[0])
	}
	if math.Abs(skews[2]-0.1) > 0.03 {
		t.Fatalf("α=1000: mean largest-class share %.3f, want ≈ 0.1", skews[2])
	}
	// Extreme α and k = n: still a partition with no empty shard.
	for _, tc := range []struct {
		n, k  int
		alpha float64
	}{{20, 20, 1e-9}, {30, 7, 1e-300}, {12, 3, 0.5}} {
		sh, err := ShardIndicesLabelSkew(labels[:tc.n], classes, tc.k, tc.alpha, 1)
		if err != nil {
			t.Fatal(err)
		}
		checkPartition(t, sh, tc.n)
	}
	for _, bad := range []struct {
		k     int
		alpha float64
		lab   []int32
	}{{0, 1, labels}, {n + 1, 1, labels}, {2, 0, labels}, {2, math.NaN(), labels}, {2, math.Inf(1), labels}, {1, 1, []int32{0, 10}}, {1, 1, []int32{-1}}} {
		if _, err := ShardIndicesLabelSkew(bad.lab, classes, bad.k, bad.alpha, 1); err == nil {
			t.Errorf("k=%d α=%v accepted", bad.k, bad.alpha)
		}
	}
	d := &Dataset{Name: "d", X: make([]float32, 2*n), Y: labels, Dim: 2, Classes: classes}
	shards, err := ShardLabelSkew(d, k, 0.3, 1)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, s := range shards {
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		total += s.Len()
	}
	if total != n {
		t.Fatalf("shards hold %d rows, want %d", total, n)
	}
}

func TestSplit(t *testing.T) {
	d, _ := GaussianMixture(100, 2, 3, 1, 1)
	for i := range d.Len() {
		d.X[i*2] = float32(i) // tag rows
	}
	train, test, err := Split(d, 0.25, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := test.Len(), 25; got != want {
		t.Fatalf("test Len = %d, want %d", got, want)
	}
	if got, want := train.Len(), 75; got != want {
		t.Fatalf("train Len = %d, want %d", got, want)
	}
	var tags []int
	for _, part := range []*Dataset{train, test} {
		for i := range part.Len() {
			tag := int(part.X[i*2])
			if part.Y[i] != d.Y[tag] || part.X[i*2+1] != d.X[tag*2+1] {
				t.Fatalf("row %d does not match source row %d", i, tag)
			}
			tags = append(tags, tag)
		}
	}
	slices.Sort(tags)
	for i, tag := range tags {
		if tag != i {
			t.Fatalf("split is not a partition: tags %v", tags)
		}
	}
	if train.Name != d.Name+"-train" || test.Name != d.Name+"-test" {
		t.Fatalf("names %q, %q", train.Name, test.Name)
	}
	_, test2, _ := Split(d, 0.25, 4)
	if !slices.Equal(test.X, test2.X) {
		t.Fatal("not deterministic")
	}
	for _, f := range []float64{0, 1, -0.5, math.NaN(), 0.001} {
		if _, _, err := Split(d, f, 1); err == nil {
			t.Errorf("testFraction %v accepted", f)
		}
	}
}

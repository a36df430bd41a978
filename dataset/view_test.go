package dataset

import (
	"errors"
	"runtime"
	"slices"
	"testing"
)

// allocated returns the bytes f allocates (runtime.MemStats.TotalAlloc).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestShardViewsIIDShareTheData(t *testing.T) {
	const n, dim, k, seed = 20000, 64, 3, 5
	d, err := GaussianMixture(n, dim, 4, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	dataBytes := uint64(len(d.X)*4 + len(d.Y)*4)
	var views []View
	viewBytes := allocated(func() {
		if views, err = ShardViewsIID(d, k, seed); err != nil {
			t.Fatal(err)
		}
	})
	var copies []*Dataset
	copyBytes := allocated(func() {
		if copies, err = ShardIID(d, k, seed); err != nil {
			t.Fatal(err)
		}
	})
	// The views allocate their index lists (8 bytes a row, a permutation),
	// not the rows' 260 bytes: well under a quarter of the data. The copies
	// allocate all of it again (the bound is one the copies fail).
	if viewBytes > dataBytes/4 {
		t.Errorf("ShardViewsIID allocated %d bytes for %d bytes of data", viewBytes, dataBytes)
	}
	if copyBytes < dataBytes {
		t.Errorf("ShardIID allocated %d bytes, less than the %d bytes of data it copies", copyBytes, dataBytes)
	}
	want, err := ShardIndicesIID(n, k, seed)
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]bool, n)
	for s, v := range views {
		if v.Data != d {
			t.Fatalf("view %d does not share the dataset", s)
		}
		if !slices.Equal(v.Rows, want[s]) {
			t.Fatalf("view %d's rows are not ShardIndicesIID's", s)
		}
		if v.Name != copies[s].Name || v.Len() != copies[s].Len() {
			t.Fatalf("view %d is %q with %d rows, the copy %q with %d", s, v.Name, v.Len(), copies[s].Name, copies[s].Len())
		}
		if err := v.Check(); err != nil {
			t.Fatal(err)
		}
		// The same rows as the copied shard, in the same order.
		pos := make([]int, v.Len())
		for i := range pos {
			pos[i] = i
		}
		for i, row := range v.Map(pos) {
			if seen[row] {
				t.Fatalf("row %d in two views", row)
			}
			seen[row] = true
			if !slices.Equal(d.Row(row), copies[s].Row(i)) || d.Y[row] != copies[s].Y[i] {
				t.Fatalf("view %d position %d (row %d) differs from the copied shard", s, i, row)
			}
		}
	}
	if i := slices.Index(seen, false); i >= 0 {
		t.Fatalf("row %d in no view", i)
	}
}

func TestViewCheckAndMap(t *testing.T) {
	d, err := GaussianMixture(10, 2, 2, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	all := All(d)
	if all.Len() != 10 || all.Check() != nil {
		t.Fatalf("All: %d rows, Check %v", all.Len(), all.Check())
	}
	if got := all.Map([]int{0, 9}); !slices.Equal(got, []int{0, 9}) {
		t.Fatalf("All.Map = %v", got)
	}
	v := View{Name: "v", Data: d, Rows: []int{1, 4, 7}}
	if got := v.Map([]int{2, 0}); !slices.Equal(got, []int{7, 1}) {
		t.Fatalf("Map = %v, want [7 1]", got)
	}
	for _, bad := range []View{
		{Name: "nil"},
		{Name: "out", Data: d, Rows: []int{3, 10}},
		{Name: "neg", Data: d, Rows: []int{-1}},
		{Name: "dup", Data: d, Rows: []int{2, 2}},
		{Name: "order", Data: d, Rows: []int{5, 4}},
	} {
		if err := bad.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("view %s: Check = %v, want ErrInvalid", bad.Name, err)
		}
	}
	for _, p := range []int{-1, 10} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("All.Map(%d) did not panic", p)
				}
			}()
			all.Map([]int{p})
		}()
	}
}

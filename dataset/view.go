package dataset

import "fmt"

// View is a subset of a Dataset's rows that shares its storage instead of
// copying it: in-process nodes (coordinator local) each hold a View of
// the one training set loaded, so the data is in memory once, whatever
// the number of nodes. Rows index Data; nil Rows means every row. Nobody
// may modify Data while a View of it is in use.
type View struct {
	// Name names the view ("<name>-shard<i>" for a shard).
	Name string
	// Data is the dataset viewed, shared read-only.
	Data *Dataset
	// Rows are the rows of Data in the view, increasing and distinct; nil
	// means all of Data's rows.
	Rows []int
}

// All is the view of every row of d.
func All(d *Dataset) View { return View{Name: d.Name, Data: d} }

// Len returns the number of rows in the view.
func (v View) Len() int {
	if v.Rows == nil {
		return v.Data.Len()
	}
	return len(v.Rows)
}

// Check reports whether v is well formed: Data set, Rows increasing (so
// distinct) and within [0, Data.Len()). Errors wrap ErrInvalid.
func (v View) Check() error {
	if v.Data == nil {
		return fmt.Errorf("%w: view %q of no dataset", ErrInvalid, v.Name)
	}
	for j, i := range v.Rows {
		if i < 0 || i >= v.Data.Len() {
			return fmt.Errorf("%w: view %q: row %d outside [0, %d)", ErrInvalid, v.Name, i, v.Data.Len())
		}
		if j > 0 && i <= v.Rows[j-1] {
			return fmt.Errorf("%w: view %q: rows not increasing at %d", ErrInvalid, v.Name, j)
		}
	}
	return nil
}

// Map replaces every index of idx, a position in [0, v.Len()), by its row
// of v.Data, in place, and returns idx. It panics if a position is out of
// range (programmer error).
func (v View) Map(idx []int) []int {
	if v.Rows == nil {
		for _, p := range idx {
			if p < 0 || p >= v.Data.Len() {
				panic(fmt.Sprintf("dataset: View.Map: position %d outside [0, %d)", p, v.Data.Len()))
			}
		}
		return idx
	}
	for j, p := range idx {
		idx[j] = v.Rows[p]
	}
	return idx
}

// ShardViewsIID is ShardIID without copying: the same partition of d's
// rows (ShardIndicesIID with the same k and seed), as views of d. The
// views partition d's rows exactly, and the one copy of d is shared.
func ShardViewsIID(d *Dataset, k int, seed uint64) ([]View, error) {
	idx, err := ShardIndicesIID(d.Len(), k, seed)
	if err != nil {
		return nil, err
	}
	out := make([]View, k)
	for s, rows := range idx {
		out[s] = View{Name: fmt.Sprintf("%s-shard%d", d.Name, s), Data: d, Rows: rows}
	}
	return out, nil
}

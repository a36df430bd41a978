package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"codeberg.org/sbinet/npyio"
	"github.com/parquet-go/parquet-go"
	"gonum.org/v1/gonum/mat"

	"github.com/dpcluster/dpcluster/dataset"
)

// siteRow is a Parquet row of a site's file in TestLocalSitesLabels.
type siteRow[L any] struct {
	F0    float64 `parquet:"f0"`
	F1    float64 `parquet:"f1"`
	Label L       `parquet:"label"`
}

// TestLocalSitesLabels: sites of one node-local run that store their
// labels differently join it alike. In a run with class names, a CSV
// site with the names, an NPY site with integers and a Parquet site with
// integers all hold the same classes (an integer indexes the names); in
// a run with only a class count, a Parquet site whose label column holds
// the strings "0".."K-1" has those classes, and a CSV site with names is
// refused with the fix (labels: in the run file).
func TestLocalSitesLabels(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	csvNames := write("a.csv", "f0,f1,label\n1,2,gamma\n3,4,alpha\n")
	npyPath := filepath.Join(dir, "b.npy")
	f, err := os.Create(npyPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := npyio.Write(f, mat.NewDense(2, 3, []float64{2, 1, 2, 0, 3, 4})); err != nil {
		t.Fatal(err)
	}
	f.Close()
	pqInts := filepath.Join(dir, "c.parquet")
	if err := parquet.WriteFile(pqInts, []siteRow[int64]{{1, 2, 2}, {3, 4, 0}}); err != nil {
		t.Fatal(err)
	}
	pqStrings := filepath.Join(dir, "d.parquet")
	if err := parquet.WriteFile(pqStrings, []siteRow[string]{{1, 2, "2"}, {3, 4, "0"}}); err != nil {
		t.Fatal(err)
	}

	named := runSpec{LabelColumn: "label", InputShape: []int{2}, Labels: []string{"alpha", "beta", "gamma"}}
	sc, err := named.schema()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{csvNames, npyPath, pqInts} {
		d, err := named.readLocal(path, sc)
		if err != nil {
			t.Fatalf("%s in a run with class names: %v", filepath.Base(path), err)
		}
		if !slices.Equal(d.Y, []int32{2, 0}) || dataset.SchemaOf(d).String() != sc.String() {
			t.Errorf("%s: labels %v, schema %s; want [2 0] and the run's %s", filepath.Base(path), d.Y, dataset.SchemaOf(d), sc)
		}
	}

	counted := runSpec{LabelColumn: "label", InputShape: []int{2}, Classes: 3}
	if sc, err = counted.schema(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{npyPath, pqInts, pqStrings} {
		d, err := counted.readLocal(path, sc)
		if err != nil {
			t.Fatalf("%s in a run of 3 classes: %v", filepath.Base(path), err)
		}
		if !slices.Equal(d.Y, []int32{2, 0}) || dataset.SchemaOf(d).String() != sc.String() {
			t.Errorf("%s: labels %v, schema %s; want [2 0] and the run's %s", filepath.Base(path), d.Y, dataset.SchemaOf(d), sc)
		}
	}
	_, err = counted.readLocal(csvNames, sc)
	if err == nil || !strings.Contains(err.Error(), `label "gamma"`) || !strings.Contains(err.Error(), "labels: in the run file") ||
		strings.Contains(err.Error(), "\n") {
		t.Errorf("a CSV with names in a run of 3 classes: %v; want a one-line refusal naming the label and labels: in the run file", err)
	}
}

package dataset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// errShape is shaper's refusal.
var errShape = errors.New("shape mismatch")

// shaper is a model's shape: dim features and classes labels.
type shaper struct{ dim, classes int }

func (s shaper) InputShape() []int { return []int{s.dim} }
func (s shaper) InputSize() int    { return s.dim }
func (s shaper) Classes() int      { return s.classes }
func (s shaper) CheckDataset(d *Dataset) error {
	if d.Dim != s.dim || d.Classes != s.classes {
		return fmt.Errorf("%w: %d features, %d classes", errShape, d.Dim, d.Classes)
	}
	return nil
}

// writeCSV writes rows rows of 3 features and a label in [0, 2).
// writeCSV writes rows first, first+1, … (each row i is label i%2 and
// features i, i+1, i+2) to dir/name and returns its path.
func writeCSV(t *testing.T, dir, name string, first, rows int) string {
	t.Helper()
	var b strings.Builder
	for i := first; i < first+rows; i++ {
		fmt.Fprintf(&b, "%d,%d,%d,%d\n", i%2, i, i+1, i+2)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    RunOptions
		want string // "" : valid
	}{
		{"fashion", RunOptions{Dataset: NameFashionMNIST, Dir: "d"}, ""},
		{"gaussian", RunOptions{Dataset: NameGaussian}, ""},
		{"csv", RunOptions{Dataset: NameCSV, Path: "a.csv", EvalPath: "b.csv"}, ""},
		{"csv holdout", RunOptions{Dataset: NameCSV, Path: "a.csv", EvalHoldout: 0.2}, ""},
		{"unknown", RunOptions{Dataset: "imagenet"}, "dataset must be"},
		{"empty", RunOptions{}, "dataset must be"},
		{"fashion with a path", RunOptions{Dataset: NameFashionMNIST, Path: "a.csv"}, "data_path is for dataset csv"},
		{"gaussian with a dir", RunOptions{Dataset: NameGaussian, Dir: "d"}, "neither"},
		{"csv without a path", RunOptions{Dataset: NameCSV}, "needs data_path"},
		{"csv with a dir", RunOptions{Dataset: NameCSV, Path: "a.csv", Dir: "d"}, "Fashion-MNIST directory"},
		{"both evaluations", RunOptions{Dataset: NameCSV, Path: "a.csv", EvalPath: "b.csv", EvalHoldout: 0.2}, "not both"},
		{"holdout 1", RunOptions{Dataset: NameCSV, Path: "a.csv", EvalHoldout: 1}, "eval_split_from_train"},
		{"holdout negative", RunOptions{Dataset: NameCSV, Path: "a.csv", EvalHoldout: -0.1}, "eval_split_from_train"},
		{"eval path for gaussian", RunOptions{Dataset: NameGaussian, EvalPath: "b.csv"}, "for dataset file"},
		{"holdout for fashion", RunOptions{Dataset: NameFashionMNIST, EvalHoldout: 0.2}, "for dataset file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrRunOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrRunOptions mentioning %q", err, tc.want)
			}
		})
	}
}

func TestLoadRun(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	train := writeCSV(t, dir, "train.csv", 0, 100)
	eval := writeCSV(t, dir, "eval.csv", 1000, 30)
	overlapping := writeCSV(t, dir, "overlapping.csv", 90, 30) // rows 90-99 are training rows
	link := filepath.Join(dir, "link.csv")
	if err := os.Symlink(train, link); err != nil {
		t.Fatal(err)
	}
	m := shaper{dim: 3, classes: 2}

	t.Run("csv trains on every row and evaluates nothing", func(t *testing.T) {
		tr, ev, err := LoadRun(ctx, RunOptions{Dataset: NameCSV, Path: train, Model: m})
		if err != nil || tr.Len() != 100 || ev.Data != nil || ev.Holdout {
			t.Fatalf("train %v, eval %+v, err %v", tr.Len(), ev, err)
		}
		if tr.Name != "train" {
			t.Errorf("name %q, want the file's base name", tr.Name)
		}
	})
	t.Run("csv with a public evaluation file", func(t *testing.T) {
		tr, ev, err := LoadRun(ctx, RunOptions{Dataset: NameCSV, Path: train, EvalPath: eval, Model: m})
		if err != nil || tr.Len() != 100 || ev.Data == nil || ev.Data.Len() != 30 || ev.Holdout {
			t.Fatalf("train %v, eval %+v, err %v", tr, ev, err)
		}
	})
	t.Run("csv holdout is marked and removed from training", func(t *testing.T) {
		tr, ev, err := LoadRun(ctx, RunOptions{Dataset: NameCSV, Path: train, EvalHoldout: 0.2, Model: m})
		if err != nil || ev.Data == nil || !ev.Holdout || tr.Len()+ev.Data.Len() != 100 || ev.Data.Len() != 20 {
			t.Fatalf("train %v, eval %+v, err %v", tr, ev, err)
		}
		// The same options hold out the same rows in every process.
		tr2, _, err := LoadRun(ctx, RunOptions{Dataset: NameCSV, Path: train, EvalHoldout: 0.2, Model: m})
		if err != nil || !slices.Equal(tr.X, tr2.X) {
			t.Errorf("a second load trains on other rows (%v)", err)
		}
	})
	t.Run("gaussian is a fixed draw shaped by the model", func(t *testing.T) {
		tr, ev, err := LoadRun(ctx, RunOptions{Dataset: NameGaussian, Model: m})
		if err != nil || tr.Len() != 10000 || ev.Data.Len() != 2000 || ev.Holdout || tr.Dim != 3 || tr.Classes != 2 {
			t.Fatalf("train %v, eval %+v, err %v", tr, ev, err)
		}
		tr2, _, err := LoadRun(ctx, RunOptions{Dataset: NameGaussian, Model: m})
		if err != nil || !slices.Equal(tr.X, tr2.X) {
			t.Errorf("two gaussian loads differ (%v)", err)
		}
	})
	for _, tc := range []struct {
		name    string
		o       RunOptions
		wantErr error
		want    string
	}{
		{"gaussian without a model", RunOptions{Dataset: NameGaussian}, ErrRunOptions, "needs a model"},
		{"evaluation file is the training file", RunOptions{Dataset: NameCSV, Path: train, EvalPath: train}, ErrEvalOverlap, "all 100 of its 100 rows"},
		{"evaluation file links to the training file", RunOptions{Dataset: NameCSV, Path: train, EvalPath: link}, ErrEvalOverlap, "all 100 of its 100 rows"},
		{"evaluation file holds training rows", RunOptions{Dataset: NameCSV, Path: train, EvalPath: overlapping}, ErrEvalOverlap, "10 of its 30 rows"},
		{"missing evaluation file", RunOptions{Dataset: NameCSV, Path: train, EvalPath: filepath.Join(dir, "nope.csv")}, os.ErrNotExist, "eval_path"},
		{"missing training file", RunOptions{Dataset: NameCSV, Path: filepath.Join(dir, "nope.csv")}, os.ErrNotExist, "nope.csv"},
		{"training data does not fit the model", RunOptions{Dataset: NameCSV, Path: train, Model: shaper{dim: 4, classes: 2}}, errShape, "does not fit the model"},
		{"labels beyond the model's classes", RunOptions{Dataset: NameCSV, Path: train, Model: shaper{dim: 3, classes: 1}}, ErrCSV, "train.csv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, ev, err := LoadRun(ctx, tc.o)
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %v mentioning %q", err, tc.wantErr, tc.want)
			}
			if tr != nil || ev.Data != nil {
				t.Errorf("data returned with an error")
			}
		})
	}
}

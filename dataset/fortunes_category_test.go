package dataset

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeCategoryFortunes writes a fortune file per category in dir: n[name]
// fortunes each, "%"-separated, every fortune naming its category.
func writeCategoryFortunes(t *testing.T, dir string, n map[string]int) {
	t.Helper()
	for name, k := range n {
		var b strings.Builder
		for i := range k {
			fmt.Fprintf(&b, "The %s fortune number %d,\nabout %s things.\n%%\n", name, i, name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadFortuneCategories: every fortune of a category with enough of
// them is one example labelled by its file's name; a small category, the
// index files (".dat") and the ".u8" links are left out; the split is by
// document, 10% for evaluation, the same on every load, and the tokens
// are the hashing tokenizer's.
func TestLoadFortuneCategories(t *testing.T) {
	dir := t.TempDir()
	writeCategoryFortunes(t, dir, map[string]int{"science": 70, "people": MinCategoryFortunes, "tiny": MinCategoryFortunes - 1})
	if err := os.WriteFile(filepath.Join(dir, "science.dat"), []byte("binary index"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("science", filepath.Join(dir, "science.u8")); err != nil {
		t.Fatal(err)
	}
	o := FileOptions{SeqLen: 16, Vocab: 1 << 22}
	train, test, err := LoadFortuneCategories(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(train.LabelNames, []string{"people", "science"}) || train.Classes != 2 || test.Classes != 2 {
		t.Fatalf("classes %d %v, want people and science", train.Classes, train.LabelNames)
	}
	if n := train.Len() + test.Len(); n != 70+MinCategoryFortunes || test.Len() != 12 {
		t.Errorf("%d training and %d evaluation documents, want %d and 12", train.Len(), test.Len(), 70+MinCategoryFortunes-12)
	}
	if err := train.Validate(); err != nil {
		t.Error(err)
	}
	tok := HashTokenizer{Vocab: 1 << 22, SeqLen: 16}
	want := make([]float32, 16)
	seen := map[string]int32{}
	for _, d := range []*Dataset{train, test} {
		for i := range d.Len() {
			name := d.LabelNames[d.Y[i]]
			// Each document names its category and its number: find which
			// one this row is by tokenizing every candidate.
			found := false
			for k := range 70 {
				tok.Tokenize(fmt.Sprintf("The %s fortune number %d,\nabout %s things.", name, k, name), want)
				if slices.Equal(d.Row(i), want) {
					key := fmt.Sprintf("%s/%d", name, k)
					if _, dup := seen[key]; dup {
						t.Fatalf("document %s in both splits or twice", key)
					}
					seen[key], found = d.Y[i], true
					break
				}
			}
			if !found {
				t.Fatalf("%s row %d (%s) is no fortune of its category", d.Name, i, name)
			}
		}
	}
	again, againTest, err := LoadFortuneCategories(dir, o)
	if err != nil || !slices.Equal(again.X, train.X) || !slices.Equal(againTest.Y, test.Y) {
		t.Errorf("a second load differs (%v)", err)
	}
	writeCategoryFortunes(t, dir, map[string]int{"people": 3})
	if _, _, err := LoadFortuneCategories(dir, o); !errors.Is(err, ErrSequence) || !strings.Contains(err.Error(), "tiny (49)") {
		t.Errorf("one category left: %v, want ErrSequence naming the small ones", err)
	}
}

// TestFortuneCategoriesPackage loads the Debian package's fortunes, where
// installed (CI installs them).
func TestFortuneCategoriesPackage(t *testing.T) {
	if _, err := os.Stat(FortunesDir); err != nil {
		if os.Getenv("DPCLUSTER_CI") != "" {
			t.Fatalf("%s: %v (CI installs the Debian package fortunes)", FortunesDir, err)
		}
		t.Skipf("%s: %v (apt-get install fortunes)", FortunesDir, err)
	}
	train, test, err := LoadFortuneCategories("", FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if train.Classes < 10 || train.Len() < 5000 || test.Len() < 500 {
		t.Errorf("%d classes, %d training and %d evaluation documents", train.Classes, train.Len(), test.Len())
	}
	t.Logf("%d classes %v, %d training and %d evaluation documents", train.Classes, train.LabelNames, train.Len(), test.Len())
}

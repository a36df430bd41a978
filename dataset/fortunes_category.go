package dataset

import (
	"fmt"
	"strings"
)

// NameFortunesCategory is the built-in labelled text dataset
// (RunOptions.Dataset): the fortunes in FortunesDir (or RunOptions.Dir),
// each one a document labelled by its file's name, its category ("people",
// "science", "startrek"), for the categories with at least
// MinCategoryFortunes fortunes; tokenized by RunOptions.File's tokenizer
// (the HashTokenizer of SeqLen and Vocab, by default DefaultSeqLen and
// DefaultTextVocab, or a checkpoint's, Tokenizer); split by document, FortunesCategoryTestShare of them
// (a fixed public draw, DefaultSequenceSeed) the evaluation split. It is a
// real text classification task that needs nothing from the network: the
// corpus is public Debian text standing in for private text.
const NameFortunesCategory = "fortunes-category"

// MinCategoryFortunes is how many fortunes a category needs to be a class
// of NameFortunesCategory: a smaller one has too few documents to learn
// from or to evaluate on.
const MinCategoryFortunes = 50

// FortunesCategoryTestShare is the share of NameFortunesCategory's
// documents in its evaluation split.
const FortunesCategoryTestShare = 0.1

// LoadFortuneCategories reads the fortune files in dir (FortunesDir if "")
// as NameFortunesCategory describes: one example per fortune, its label
// the index of its category among the categories kept (name order, named
// in LabelNames), its features the token ids o's tokenizer gives
// (textTokenizer: o.SeqLen, or a one-entry o.InputShape, and o.Vocab or
// o.Tokenizer).
// It returns the training and evaluation splits. It fails when fewer than
// two categories have MinCategoryFortunes fortunes.
func LoadFortuneCategories(dir string, o FileOptions) (train, test *Dataset, err error) {
	if dir == "" {
		dir = FortunesDir
	}
	tok, err := textTokenizer(dir, o)
	if err != nil {
		return nil, nil, err
	}
	files, err := ReadFortuneFiles(dir)
	if err != nil {
		return nil, nil, err
	}
	all := &Dataset{Name: NameFortunesCategory, Dim: tok.Len(), Shape: []int{tok.Len()}, Vocab: tok.VocabSize()}
	var small []string
	for _, f := range files {
		if len(f.Docs) < MinCategoryFortunes {
			small = append(small, fmt.Sprintf("%s (%d)", f.Name, len(f.Docs)))
			continue
		}
		label := int32(len(all.LabelNames))
		all.LabelNames = append(all.LabelNames, f.Name)
		for _, doc := range f.Docs {
			n := len(all.X)
			all.X = append(all.X, make([]float32, all.Dim)...)
			tok.Tokenize(string(doc), all.X[n:])
			all.Y = append(all.Y, label)
		}
	}
	all.Classes = len(all.LabelNames)
	if all.Classes < 2 {
		return nil, nil, fmt.Errorf("%w: %s: %s needs at least two fortune files of %d fortunes or more; it holds %d (too small: %s)",
			ErrSequence, dir, NameFortunesCategory, MinCategoryFortunes, all.Classes, strings.Join(small, ", "))
	}
	return Split(all, FortunesCategoryTestShare, DefaultSequenceSeed)
}

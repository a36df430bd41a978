package main

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dpcluster/dpcluster/dataset"
)

// FortunesDir is where the Debian package fortunes installs its files.
const FortunesDir = "/usr/share/games/fortunes"

// fortuneDoc is one entry of a fortune file with its category (the file
// name).
type fortuneDoc struct {
	class string
	words []string
}

// readFortunes reads every fortune file in dir (regular files without a
// dot in the name: "people", not "people.dat" or "people.u8"), splits it
// into entries at lines holding a single "%", and tokenizes each entry.
// Files are visited in name order, so the result is deterministic.
func readFortunes(dir string) ([]fortuneDoc, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("fortunes: %w (install the Debian package fortunes)", err)
	}
	var docs []fortuneDoc
	for _, e := range ents { // os.ReadDir sorts by name
		if !e.Type().IsRegular() || strings.Contains(e.Name(), ".") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		var cur []string
		flush := func() {
			if len(cur) > 0 {
				docs = append(docs, fortuneDoc{class: e.Name(), words: cur})
			}
			cur = nil
		}
		for sc.Scan() {
			line := sc.Text()
			if strings.TrimSpace(line) == "%" {
				flush()
				continue
			}
			cur = append(cur, tokenize(line)...)
		}
		flush()
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("fortunes: %s: %w", e.Name(), err)
		}
	}
	return docs, nil
}

// tokenize lower-cases s and returns its maximal runs of ASCII letters and
// digits. Backspace overstriking ("_\bx", used for underlining in some
// fortune files) is removed first: a character followed by a backspace is
// dropped.
func tokenize(s string) []string {
	if strings.IndexByte(s, '\b') >= 0 {
		var b []byte
		for i := 0; i < len(s); i++ {
			if s[i] == '\b' {
				if len(b) > 0 {
					b = b[:len(b)-1]
				}
				continue
			}
			b = append(b, s[i])
		}
		s = string(b)
	}
	var out []string
	start := -1
	for i := 0; i <= len(s); i++ {
		c := byte(0)
		if i < len(s) {
			c = s[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
		}
		word := ('a' <= c && c <= 'z') || ('0' <= c && c <= '9')
		if word && start < 0 {
			start = i
		}
		if !word && start >= 0 {
			out = append(out, strings.ToLower(s[start:i]))
			start = -1
		}
	}
	return out
}

// textTask turns tokenized documents into train and test token datasets:
// categories with at least minPerClass documents become classes, numbered
// from the most to the least frequent (ties by name), so class frequencies
// are heavy-tailed as in the files; documents are split into train and
// test with dataset.Split's seeded shuffle; the vocabulary is id 0 for
// unknown words plus the vocab-1 most frequent words of the training split
// (ties by word), and each document keeps its first maxLen tokens.
//
// The vocabulary is computed from the training split and treated as
// public, as a pre-trained tokenizer would be; a private pipeline would
// build it from public text.
func textTask(docs []fortuneDoc, minPerClass, vocab, maxLen int, testFraction float64, seed uint64) (train, test *dataset.Dataset, classes []string, err error) {
	count := map[string]int{}
	for _, d := range docs {
		count[d.class]++
	}
	for c, n := range count {
		if n >= minPerClass {
			classes = append(classes, c)
		}
	}
	slices.SortFunc(classes, func(a, b string) int {
		return cmp.Or(cmp.Compare(count[b], count[a]), cmp.Compare(a, b))
	})
	if len(classes) < 2 {
		return nil, nil, nil, fmt.Errorf("text task: %d categories with ≥ %d documents, need 2", len(classes), minPerClass)
	}
	label := map[string]int32{}
	for i, c := range classes {
		label[c] = int32(i)
	}
	var kept []fortuneDoc
	for _, d := range docs {
		if _, ok := label[d.class]; ok {
			kept = append(kept, d)
		}
	}
	// Split on indices first (a one-column dataset of row numbers), so the
	// vocabulary can be computed from the training part only.
	idx := &dataset.Dataset{Name: "fortunes", X: make([]float32, len(kept)), Y: make([]int32, len(kept)), Dim: 1, Classes: len(classes)}
	for i := range kept {
		idx.X[i] = float32(i)
		idx.Y[i] = label[kept[i].class]
	}
	trIdx, teIdx, err := dataset.Split(idx, testFraction, seed)
	if err != nil {
		return nil, nil, nil, err
	}
	freq := map[string]int{}
	for _, x := range trIdx.X {
		for _, w := range kept[int(x)].words {
			freq[w]++
		}
	}
	words := make([]string, 0, len(freq))
	for w := range freq {
		words = append(words, w)
	}
	slices.SortFunc(words, func(a, b string) int { return cmp.Or(cmp.Compare(freq[b], freq[a]), cmp.Compare(a, b)) })
	ids := map[string]int32{}
	for i, w := range words[:min(len(words), vocab-1)] {
		ids[w] = int32(i + 1)
	}
	build := func(part *dataset.Dataset, name string) (*dataset.Dataset, error) {
		toks := make([][]int32, part.Len())
		for i, x := range part.X {
			d := kept[int(x)]
			t := make([]int32, 0, min(len(d.words), maxLen))
			for _, w := range d.words[:min(len(d.words), maxLen)] {
				t = append(t, ids[w]) // 0 when unknown
			}
			toks[i] = t
		}
		ds, err := dataset.FromTokens(toks, part.Y, maxLen, vocab, len(classes))
		if err == nil {
			ds.Name = name
		}
		return ds, err
	}
	if train, err = build(trIdx, "fortunes-train"); err != nil {
		return nil, nil, nil, err
	}
	if test, err = build(teIdx, "fortunes-test"); err != nil {
		return nil, nil, nil, err
	}
	return train, test, classes, nil
}

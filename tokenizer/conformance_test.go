package tokenizer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The conformance tests run the Python references in testdata/ (restated
// from google-research/bert's tokenization.py and openai/gpt-2's
// src/encoder.py; each file's header names the commit) on the corpus
// (corpus_test.go) with vocabularies built from it here, and require the
// same ids for every string.

// conformanceRandom is the number of random strings of the corpus.
const conformanceRandom = 1500

// python returns a python3 that imports every one of modules:
// $DPCLUSTER_PYTHON, python3 on PATH, or Debian's /usr/bin/python3 (a
// PATH python3 may be another installation without Debian's packages).
func python(modules ...string) string {
	imp := "import " + strings.Join(append([]string{"json", "unicodedata"}, modules...), ", ")
	for _, p := range []string{os.Getenv("DPCLUSTER_PYTHON"), "python3", "/usr/bin/python3"} {
		if p != "" && exec.Command(p, "-c", imp).Run() == nil {
			return p
		}
	}
	return ""
}

// requirePython returns a python3 with modules, or skips the test without
// one; with DPCLUSTER_CI set (CI, whose scripts/lib/setup.sh installs
// python3-regex) it fails instead.
func requirePython(t *testing.T, modules ...string) string {
	t.Helper()
	py := python(modules...)
	if py == "" {
		msg := fmt.Sprintf("needs python3 with the modules %v (Debian: apt-get install python3 python3-regex)", modules)
		if os.Getenv("DPCLUSTER_CI") != "" {
			t.Fatal("DPCLUSTER_CI is set but no python3 imports them: " + msg)
		}
		t.Skip(msg + "; never skipped in CI")
	}
	return py
}

// pyResult is one string's result from a reference script.
type pyResult struct {
	Pieces []string `json:"pieces"`
	Tokens []string `json:"tokens"`
	IDs    []int32  `json:"ids"`
}

// runReference writes corpus to dir, runs script with args then the
// corpus's path, and returns its results, one per string. It fails the
// test when the script's Unicode database is older than 14.0, which the
// corpus assumes (stableRune).
func runReference(t *testing.T, py, dir, script string, corpus []string, args ...string) []pyResult {
	t.Helper()
	cpath := filepath.Join(dir, "corpus.json")
	writeJSON(t, cpath, corpus)
	cmd := exec.Command(py, append(append([]string{filepath.Join("testdata", script)}, args...), cpath)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", py, script, err, stderr.Bytes())
	}
	var res struct {
		Unidata string     `json:"unidata_version"`
		Results []pyResult `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%s: output is not its JSON: %v", script, err)
	}
	if major, _, _ := strings.Cut(res.Unidata, "."); atoi(major) < 14 {
		t.Fatalf("%s's unicodedata is Unicode %s: the corpus needs 14.0 or later (Python 3.11 or later)", py, res.Unidata)
	}
	if len(res.Results) != len(corpus) {
		t.Fatalf("%s returned %d results for %d strings", script, len(res.Results), len(corpus))
	}
	return res.Results
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// compareIDs reports each string whose ids differ (the first few in
// detail) and returns the number of tokens compared.
func compareIDs(t *testing.T, corpus []string, ref []pyResult, got func(string) ([]int32, []string)) int {
	t.Helper()
	bad, tokens := 0, 0
	for i, s := range corpus {
		ids, toks := got(s)
		tokens += len(ids)
		if slices.Equal(ids, ref[i].IDs) {
			continue
		}
		bad++
		if bad <= 10 {
			t.Errorf("string %d %+q:\n go     %v %q\n python %v %q", i, s, ids, toks, ref[i].IDs, ref[i].Tokens)
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d strings differ from the reference", bad, len(corpus))
	}
	return tokens
}

// TestWordPieceConformance tokenizes the corpus with a WordPiece
// vocabulary built from it, lower-cased and cased, and requires the ids of
// testdata/bert_wordpiece.py for every string.
func TestWordPieceConformance(t *testing.T) {
	py := requirePython(t)
	corpus := conformanceCorpus(conformanceRandom)
	dir := t.TempDir()
	vocab := buildWordPieceVocab(corpus[:len(handCases)+conformanceRandom])
	vpath := filepath.Join(dir, "vocab.txt")
	if err := os.WriteFile(vpath, []byte(strings.Join(vocab, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, lower := range []bool{true, false} {
		t.Run(fmt.Sprintf("lower=%t", lower), func(t *testing.T) {
			cfg := DefaultWordPieceConfig()
			cfg.LowerCase = lower
			w, err := LoadWordPiece(vpath, cfg)
			if err != nil {
				t.Fatal(err)
			}
			flag := "0"
			if lower {
				flag = "1"
			}
			ref := runReference(t, py, dir, "bert_wordpiece.py", corpus, vpath, flag)
			n := compareIDs(t, corpus, ref, func(s string) ([]int32, []string) { return w.AppendIDs(nil, s), w.Tokens(s) })
			t.Logf("%d strings, %d tokens, vocabulary of %d", len(corpus), n, w.VocabSize())
		})
	}
}

// TestBPEConformance tokenizes the corpus with a byte-level BPE trained on
// it and requires the pre-tokenization pieces and the ids of
// testdata/gpt2_bpe.py for every string.
func TestBPEConformance(t *testing.T) {
	py := requirePython(t, "regex")
	corpus := conformanceCorpus(conformanceRandom)
	dir := t.TempDir()
	vocab, merges := trainBPE(corpus[:len(handCases)+conformanceRandom], 400)
	vpath, mpath := filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt")
	writeJSON(t, vpath, vocab)
	var m strings.Builder
	m.WriteString("#version: 0.2\n")
	for _, p := range merges {
		m.WriteString(p[0] + " " + p[1] + "\n")
	}
	if err := os.WriteFile(mpath, []byte(m.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := LoadBPE(vpath, mpath, DefaultBPEConfig())
	if err != nil {
		t.Fatal(err)
	}
	ref := runReference(t, py, dir, "gpt2_bpe.py", corpus, vpath, mpath)
	bad := 0
	for i, s := range corpus {
		if got := preTokens(s); !slices.Equal(got, ref[i].Pieces) {
			if bad++; bad <= 10 {
				t.Errorf("string %d %+q: pieces\n go     %+q\n python %+q", i, s, got, ref[i].Pieces)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d strings are cut into other pieces than the reference's", bad, len(corpus))
	}
	n := compareIDs(t, corpus, ref, func(s string) ([]int32, []string) { return b.AppendIDs(nil, s), b.Tokens(s) })
	t.Logf("%d strings, %d tokens, %d merges, vocabulary of %d", len(corpus), n, len(merges), b.VocabSize())
}

// buildWordPieceVocab returns a vocabulary for corpus in id order: the
// special tokens, the 400 most frequent words of the basic tokenization
// (lower-cased and cased), the most frequent word starts and "##"
// continuations of 2 to 4 characters, and the single characters as both,
// but for every seventh character, so that some words have no split and
// are [UNK]. A repeated token, a blank line and a token between spaces
// test the file's reading. Ties in frequency go to the smaller string.
func buildWordPieceVocab(corpus []string) []string {
	words := map[string]int{}
	for _, s := range corpus {
		for _, lower := range []bool{true, false} {
			for _, w := range basicTokens(nil, s, lower) {
				words[w]++
			}
		}
	}
	starts, conts, chars := map[string]int{}, map[string]int{}, map[string]int{}
	for w, c := range words {
		r := []rune(w)
		for i := range r {
			chars[string(r[i])] += c
			for n := 2; n <= 4 && i+n <= len(r); n++ {
				if i == 0 {
					starts[string(r[:n])] += c
				} else {
					conts["##"+string(r[i:i+n])] += c
				}
			}
		}
	}
	vocab := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "", "  the  "}
	seen := map[string]bool{}
	add := func(tokens []string) {
		for _, t := range tokens {
			if !seen[t] {
				seen[t] = true
				vocab = append(vocab, t)
			}
		}
	}
	add(top(words, 400))
	add(top(starts, 300))
	add(top(conts, 300))
	for i, c := range slices.Sorted(maps.Keys(chars)) {
		if i%7 != 3 {
			add([]string{c, "##" + c})
		}
	}
	return append(vocab, "the")
}

// top returns the n keys of counts with the highest counts, ties to the
// smaller key.
func top(counts map[string]int, n int) []string {
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), strings.Compare(a, b))
	})
	return keys[:min(n, len(keys))]
}

// trainBPE learns up to n merges from corpus's pre-tokenized pieces with
// the usual greedy trainer: start from byte symbols, merge the most
// frequent adjacent pair (ties to the smaller pair of strings), repeat.
// The vocabulary is the 256 byte symbols in byte order, each merge's new
// symbol, then <|endoftext|>; the merges are returned in rank order, with
// the first one repeated at the end (a pair merged twice has its last
// rank).
func trainBPE(corpus []string, n int) (map[string]int32, [][2]string) {
	counts := map[string]int{}
	for _, s := range corpus {
		for _, p := range preTokens(s) {
			counts[p]++
		}
	}
	vocab := map[string]int32{}
	var names []string // by id
	id := func(sym string) int32 {
		if v, ok := vocab[sym]; ok {
			return v
		}
		vocab[sym] = int32(len(names))
		names = append(names, sym)
		return vocab[sym]
	}
	for _, r := range byteSymbols {
		id(string(r))
	}
	type word struct {
		syms  []int32
		count int
	}
	var words []word
	for _, p := range slices.Sorted(maps.Keys(counts)) {
		syms := make([]int32, len(p))
		for i := range len(p) {
			syms[i] = vocab[string(byteSymbols[p[i]])]
		}
		words = append(words, word{syms, counts[p]})
	}
	var merges [][2]string
	pairs := map[uint64]int{}
	for len(merges) < n {
		clear(pairs)
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[pairKey(w.syms[i], w.syms[i+1])] += w.count
			}
		}
		if len(pairs) == 0 {
			break
		}
		var best uint64
		bestCount := -1
		for k, c := range pairs {
			if c > bestCount || c == bestCount && pairLess(names, k, best) {
				best, bestCount = k, c
			}
		}
		a, b := int32(best>>32), int32(uint32(best))
		merges = append(merges, [2]string{names[a], names[b]})
		ab := id(names[a] + names[b])
		for k, w := range words {
			out := w.syms[:0]
			for i := 0; i < len(w.syms); i++ {
				if i+1 < len(w.syms) && w.syms[i] == a && w.syms[i+1] == b {
					out = append(out, ab)
					i++
				} else {
					out = append(out, w.syms[i])
				}
			}
			words[k].syms = out
		}
	}
	id(EndOfText)
	return vocab, append(merges, merges[0])
}

// pairLess orders two pairs of symbol ids by their strings.
func pairLess(names []string, x, y uint64) bool {
	return cmp.Or(strings.Compare(names[x>>32], names[y>>32]), strings.Compare(names[uint32(x)], names[uint32(y)])) < 0
}

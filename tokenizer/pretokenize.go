package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// GPT2Pattern is the pre-tokenization pattern of openai/gpt-2's
// src/encoder.py, for Python's regex module. Go's regexp has no lookahead,
// so preTokenEnd implements it by hand.
const GPT2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// contractions are the pattern's first seven alternatives, each an
// apostrophe and a suffix (case-sensitive, as in the pattern).
var contractions = [...]string{"s", "t", "re", "ve", "m", "ll", "d"}

// charClass is what the pattern distinguishes of a character: \s
// (White_Space), \p{L}, \p{N}, or none of them.
type charClass uint8

const (
	classOther charClass = iota
	classSpace
	classLetter
	classNumber
)

// classify returns r's class. A byte that is not valid UTF-8 arrives as
// U+FFFD (a symbol, So), so it is of classOther.
func classify(r rune) charClass {
	switch {
	case unicode.IsSpace(r): // White_Space, the regex module's \s
		return classSpace
	case unicode.IsLetter(r):
		return classLetter
	case unicode.Is(unicode.N, r):
		return classNumber
	}
	return classOther
}

// preTokenEnd returns the end of the piece of text that starts at byte i:
// the pieces, from i = 0 to the end, are what Python's
// regex.findall(GPT2Pattern, text) returns, and cover text in order. A
// backtracking engine tries the alternatives in order at each position and
// takes the first that matches, so at position i:
//
//  1. an apostrophe followed by s, t, re, ve, m, ll or d is that
//     contraction;
//  2. otherwise, an optional ASCII space then a maximal run of letters,
//     of numbers, or of characters that are neither whitespace, letters
//     nor numbers: " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+". The
//     space is taken when the character after it starts such a run (the
//     optional space is greedy); a space followed by whitespace, or
//     ending the text, starts no run and falls to 3;
//  3. otherwise i starts a run of whitespace. "\s+(?!\S)" takes the
//     maximal run when it reaches the end of the text (nothing follows
//     it, so no \S does); when it does not, the character after the run
//     is \S, so the engine backtracks one character: the run without its
//     last character, if that leaves at least one. A single whitespace
//     character before a non-space fails "\s+(?!\S)" and "\s+" takes it
//     alone. So "a   b" gives "a", "  ", " b": the last space of a run
//     goes with the word after it.
//
// Every character is whitespace, a letter, a number or none of them, so
// some alternative matches at each position and the pieces leave nothing
// out.
func preTokenEnd(text string, i int) int {
	r, _ := utf8.DecodeRuneInString(text[i:])
	if r == '\'' {
		for _, c := range contractions {
			if strings.HasPrefix(text[i+1:], c) {
				return i + 1 + len(c)
			}
		}
	}
	start, class := i, classify(r)
	if r == ' ' && i+1 < len(text) {
		if next, _ := utf8.DecodeRuneInString(text[i+1:]); classify(next) != classSpace {
			start, class = i+1, classify(next)
		}
	}
	if class != classSpace {
		return runEnd(text, start, class)
	}
	end := runEnd(text, i, classSpace)
	if end == len(text) {
		return end
	}
	_, last := utf8.DecodeLastRuneInString(text[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

// runEnd returns the end of the maximal run of characters of class c that
// starts at byte i of text.
func runEnd(text string, i int, c charClass) int {
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		if classify(r) != c {
			break
		}
		i += size
	}
	return i
}

package tokenizer

import (
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// This file is BERT's basic tokenization, the steps of BasicTokenizer in
// google-research/bert's tokenization.py (commit f18bd94, the version
// whose WordpieceTokenizer reads at most 100 characters a word and whose
// _is_control drops every category C*, as Hugging Face's BertTokenizer
// still does): clean the text, put spaces around CJK ideographs, split on
// whitespace, optionally lower-case and strip accents, split off
// punctuation. Each helper names the Python function it follows. Character
// classes come from Go's unicode tables (unicode.Version); Python's come
// from its unicodedata, so the two agree on every character both versions
// of the Unicode standard assign alike.

// basicTokens appends to dst the words of text after BERT's basic
// tokenization and returns the extended slice (BasicTokenizer.tokenize).
func basicTokens(dst []string, text string, lowerCase bool) []string {
	text = cleanText(text)
	text = spaceCJK(text)
	for _, word := range pyFields(text) {
		if lowerCase {
			word = stripAccents(pyLower(word))
		}
		dst = splitPunct(dst, word)
	}
	// The reference joins the pieces with spaces and splits them again
	// (whitespace_tokenize). No piece holds whitespace: lower-casing and
	// canonical decomposition never produce it, and splitPunct yields no
	// empty piece, so the pieces are already the result.
	return dst
}

// cleanText drops U+0000, U+FFFD and control characters and turns every
// whitespace character into a space (_clean_text). Bytes that are not
// valid UTF-8 read as U+FFFD, so they are dropped, as the reference's
// decode with errors="ignore" drops them.
func cleanText(text string) string {
	var b strings.Builder
	b.Grow(len(text))
	for _, r := range text {
		switch {
		case r == 0 || r == unicode.ReplacementChar || isControl(r):
		case isWhitespace(r):
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// isWhitespace is _is_whitespace: space, tab, newline, carriage return and
// the space separators (Zs).
func isWhitespace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || unicode.Is(unicode.Zs, r)
}

// isControl is _is_control: every character of a category C* (Cc, Cf, Co,
// Cs, and Cn, the unassigned ones) except tab, newline and carriage
// return, which are whitespace.
func isControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs, unicode.Cn)
}

// isPunct is _is_punctuation: the ASCII characters that are neither
// letters, digits, space nor controls (33-47, 58-64, 91-96, 123-126, which
// include symbols such as $, ^ and `), and every character of a category
// P*.
func isPunct(r rune) bool {
	if r >= 33 && r <= 47 || r >= 58 && r <= 64 || r >= 91 && r <= 96 || r >= 123 && r <= 126 {
		return true
	}
	return unicode.Is(unicode.P, r)
}

// isCJK is _is_chinese_char: the CJK Unified Ideographs blocks and their
// extensions A to E, and the two CJK Compatibility Ideographs blocks, by
// the reference's code point ranges. Hangul, Hiragana and Katakana are not
// in them: those scripts separate words by spaces.
func isCJK(r rune) bool {
	return r >= 0x4E00 && r <= 0x9FFF ||
		r >= 0x3400 && r <= 0x4DBF ||
		r >= 0x20000 && r <= 0x2A6DF ||
		r >= 0x2A700 && r <= 0x2B73F ||
		r >= 0x2B740 && r <= 0x2B81F ||
		r >= 0x2B820 && r <= 0x2CEAF ||
		r >= 0xF900 && r <= 0xFAFF ||
		r >= 0x2F800 && r <= 0x2FA1F
}

// spaceCJK puts a space before and after every CJK ideograph
// (_tokenize_chinese_chars), so each becomes a word of its own.
func spaceCJK(text string) string {
	if !strings.ContainsFunc(text, isCJK) {
		return text
	}
	var b strings.Builder
	b.Grow(len(text) + 16)
	for _, r := range text {
		if isCJK(r) {
			b.WriteByte(' ')
			b.WriteRune(r)
			b.WriteByte(' ')
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// pySpace reports whether Python's str.isspace holds for r: the characters
// str.split() splits on. It is the set of characters whose bidirectional
// class is WS, B or S or whose category is Zs; unlike unicode.IsSpace it
// holds for the separators U+001C to U+001F.
func pySpace(r rune) bool {
	switch {
	case r >= 0x09 && r <= 0x0D, r >= 0x1C && r <= 0x20, r == 0x85:
		return true
	case r < 0x80:
		return false
	}
	return r == 0x2028 || r == 0x2029 || unicode.Is(unicode.Zs, r)
}

// pyFields splits text around runs of pySpace characters, as Python's
// str.split() with no argument does (whitespace_tokenize): no field is
// empty.
func pyFields(text string) []string {
	return strings.FieldsFunc(text, pySpace)
}

// stripAccents decomposes word canonically (NFD) and drops the nonspacing
// marks (Mn) (_run_strip_accents).
func stripAccents(word string) string {
	d := norm.NFD.String(word)
	if !strings.ContainsFunc(d, isMn) {
		return d
	}
	return strings.Map(func(r rune) rune {
		if isMn(r) {
			return -1
		}
		return r
	}, d)
}

func isMn(r rune) bool { return unicode.Is(unicode.Mn, r) }

// splitPunct appends to dst the pieces of word with every punctuation
// character a piece of its own (_run_split_on_punc): "don't!" gives
// "don", "'", "t", "!".
func splitPunct(dst []string, word string) []string {
	start := 0
	for i, r := range word {
		if !isPunct(r) {
			continue
		}
		if i > start {
			dst = append(dst, word[start:i])
		}
		end := i + len(string(r))
		dst = append(dst, word[i:end])
		start = end
	}
	if start < len(word) {
		dst = append(dst, word[start:])
	}
	return dst
}

// pyLower lower-cases s as Python 3's str.lower does: each character's
// full lowercase mapping, which differs from its simple one
// (unicode.ToLower) only for U+0130 (İ → i followed by U+0307), and
// U+03A3 (Σ) in the Final_Sigma context, which becomes ς (U+03C2) instead
// of σ. The context is the one of the Unicode standard (section 3.13) that
// CPython's handle_capital_sigma tests: a cased character before Σ with
// only case-ignorable ones between, and no cased character after it past
// case-ignorable ones.
func pyLower(s string) string {
	var rs []rune
	for _, r := range s {
		if r == 0x130 || r == 0x3A3 || unicode.ToLower(r) != r {
			rs = []rune(s)
			break
		}
	}
	if rs == nil {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	for i, r := range rs {
		switch r {
		case 0x130:
			b.WriteString("i\u0307")
		case 0x3A3:
			if finalSigma(rs, i) {
				b.WriteRune(0x3C2)
			} else {
				b.WriteRune(0x3C3)
			}
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

// finalSigma reports whether rs[i] is in the Final_Sigma context.
func finalSigma(rs []rune, i int) bool {
	j := i - 1
	for j >= 0 && caseIgnorable(rs[j]) {
		j--
	}
	if j < 0 || !cased(rs[j]) {
		return false
	}
	j = i + 1
	for j < len(rs) && caseIgnorable(rs[j]) {
		j++
	}
	return j == len(rs) || !cased(rs[j])
}

// cased is the derived property Cased: Lowercase (Ll and
// Other_Lowercase), Uppercase (Lu and Other_Uppercase) and Lt.
func cased(r rune) bool {
	return unicode.In(r, unicode.Lu, unicode.Ll, unicode.Lt, unicode.Other_Lowercase, unicode.Other_Uppercase)
}

// caseIgnorable is the derived property Case_Ignorable: the categories
// Mn, Me, Cf, Lm and Sk, and the characters whose Word_Break property is
// MidLetter, MidNumLet or Single_Quote (WordBreakProperty.txt), listed
// here since Go's unicode package has no Word_Break table.
func caseIgnorable(r rune) bool {
	switch r {
	case 0x27, // Single_Quote
		0x2E, 0x2018, 0x2019, 0x2024, 0xFE52, 0xFF07, 0xFF0E, // MidNumLet
		0x3A, 0xB7, 0x387, 0x55F, 0x5F4, 0x2027, 0xFE13, 0xFE55, 0xFF1A: // MidLetter
		return true
	}
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk)
}

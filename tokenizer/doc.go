// Package tokenizer turns text into the token ids of a pretrained
// checkpoint: BERT's WordPiece (vocab.txt) and GPT-2's byte-level BPE
// (vocab.json and merges.txt), each as its reference implementation
// tokenizes, so that a model fine-tuned here reads the ids it was
// pretrained on.
//
// A tokenizer is a fixed public function of the text, learned from no
// private data: it costs no privacy budget, and every node, given the same
// files, produces the same ids bit for bit (no map order, clock or
// randomness reaches the output). Both types are immutable once built and
// safe for concurrent use.
//
// Usage, for a BERT checkpoint (its vocab.txt, uncased) and a GPT-2 one
// (its vocab.json and merges.txt):
//
//	cfg := tokenizer.DefaultWordPieceConfig() // uncased, MaxLen 512
//	bert, err := tokenizer.LoadWordPiece("bert/vocab.txt", cfg)
//	if err != nil { ... }
//	if err := bert.CheckVocabSize(modelVocab); err != nil { ... }
//	enc := bert.EncodePair("the question", "the passage")
//	// enc.InputIDs, enc.TokenTypeIDs, enc.AttentionMask: MaxLen each
//
//	gpt, err := tokenizer.LoadBPE("gpt2/vocab.json", "gpt2/merges.txt", tokenizer.DefaultBPEConfig())
//	if err != nil { ... }
//	ids := gpt.AppendIDs(nil, "Hello world") // no special tokens
//
// # What each follows
//
// WordPiece follows google-research/bert's tokenization.py (FullTokenizer
// at commit f18bd94, whose rules Hugging Face's BertTokenizer keeps): the
// text is cleaned (U+0000, U+FFFD and every character of a category C*
// dropped, whitespace made a space), each CJK ideograph made a word, the
// words optionally lower-cased as Python's str.lower does (Final_Sigma
// included) and stripped of accents (NFD, then the Mn marks dropped),
// punctuation split off (ASCII 33-47, 58-64, 91-96, 123-126 and the
// categories P*), then each word cut into the longest vocabulary pieces
// from its start, "##" before every piece but the first; a word of more
// than 100 characters, or with no such cut, is [UNK].
//
// BPE follows openai/gpt-2's src/encoder.py: the text is cut by GPT-2's
// pattern (GPT2Pattern; implemented by hand, as Go's regexp has no
// lookahead), each piece's UTF-8 bytes mapped to printable symbols
// (bytes_to_unicode) and merged pair by pair, lowest rank first. It adds
// no special token and gives "<|endoftext|>" in a text no special meaning,
// as the reference does.
//
// TestWordPieceConformance and TestBPEConformance run Python restatements
// of both references (testdata/*.py) on a corpus of over 3,000 strings
// (every kind of character and whitespace, contractions, accents composed
// and decomposed, words over 100 characters, and every code point Unicode
// 14.0 assigns) and require the same ids for every string. Character
// classes come from Go's unicode tables (Unicode 15.0); the references use
// Python's, so the two agree on every character assigned alike in both
// versions.
//
// # Model inputs
//
// Encode and EncodePair return an Encoding of MaxLen positions: ids,
// token types and attention mask, right-padded. For BERT, [CLS] a [SEP]
// and [CLS] a [SEP] b [SEP], types 0 then 1 from b on. For GPT-2 the
// texts' ids alone (a then b for a pair, types 0 then 1), padded with
// BPEConfig.Pad: GPT-2 has no padding token, and the default is its
// end-of-text token <|endoftext|>, as Hugging Face users set pad_token =
// eos_token. A pair too long is cut from the ends, the longer text first
// (LongestFirst, as Hugging Face's tokenizers does).
//
// Hugging Face's tokenizer.json is not read: take vocab.txt, or vocab.json
// and merges.txt, from the same checkpoint.
package tokenizer

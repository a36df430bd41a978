#!/usr/bin/env python3
# The reference WordPiece tokenizer for TestWordPieceConformance.
#
# It restates, step for step and with the same function names,
# FullTokenizer, BasicTokenizer and WordpieceTokenizer of
# google-research/bert, tokenization.py at commit
# f18bd94b8fee9bda3c293e0932d100add35b780c ("Adding support for
# multilingual models"; Apache License 2.0, Copyright 2018 The Google AI
# Language Team Authors). It is written for this test, not copied: the
# character classes come from Python's own unicodedata and str methods, as
# the reference's do, and TensorFlow is not needed (the vocabulary is read
# with open()). Python 3 only, so convert_to_unicode is the identity.
#
# That commit's _is_control drops every category C* and its
# WordpieceTokenizer reads at most 100 characters a word, as Hugging
# Face's BertTokenizer does; the repository's later commits drop only Cc
# and Cf and read 200.
#
# Usage: bert_wordpiece.py VOCAB_TXT LOWER(0|1) CORPUS_JSON
# CORPUS_JSON is a JSON list of strings; the output, on stdout, is a JSON
# list with, for each string, {"tokens": [...], "ids": [...]}.

import json
import sys
import unicodedata


def load_vocab(path):
    """Token to id, the id being the line number; a repeated token keeps
    the id of its last line."""
    vocab = {}
    index = 0
    with open(path, "r", encoding="utf-8") as reader:
        while True:
            line = reader.readline()
            if not line:
                break
            vocab[line.strip()] = index
            index += 1
    return vocab


def whitespace_tokenize(text):
    text = text.strip()
    if not text:
        return []
    return text.split()


def _is_whitespace(char):
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char):
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char).startswith("C")


def _is_punctuation(char):
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp):
    ranges = (
        (0x4E00, 0x9FFF),
        (0x3400, 0x4DBF),
        (0x20000, 0x2A6DF),
        (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF),
        (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F),
    )
    return any(lo <= cp <= hi for lo, hi in ranges)


class BasicTokenizer:
    def __init__(self, do_lower_case):
        self.do_lower_case = do_lower_case

    def tokenize(self, text):
        text = self._clean_text(text)
        text = self._tokenize_chinese_chars(text)
        split_tokens = []
        for token in whitespace_tokenize(text):
            if self.do_lower_case:
                token = self._run_strip_accents(token.lower())
            split_tokens.extend(self._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(split_tokens))

    def _run_strip_accents(self, text):
        text = unicodedata.normalize("NFD", text)
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    def _run_split_on_punc(self, text):
        output = []
        start_new_word = True
        for char in text:
            if _is_punctuation(char):
                output.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    output.append([])
                start_new_word = False
                output[-1].append(char)
        return ["".join(x) for x in output]

    def _tokenize_chinese_chars(self, text):
        out = []
        for char in text:
            if _is_chinese_char(ord(char)):
                out.extend((" ", char, " "))
            else:
                out.append(char)
        return "".join(out)

    def _clean_text(self, text):
        out = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                continue
            out.append(" " if _is_whitespace(char) else char)
        return "".join(out)


class WordpieceTokenizer:
    def __init__(self, vocab, unk_token="[UNK]", max_input_chars_per_word=100):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text):
        output_tokens = []
        for token in whitespace_tokenize(text):
            chars = list(token)
            if len(chars) > self.max_input_chars_per_word:
                output_tokens.append(self.unk_token)
                continue
            sub_tokens = []
            start = 0
            bad = False
            while start < len(chars):
                end = len(chars)
                found = None
                while start < end:
                    piece = "".join(chars[start:end])
                    if start > 0:
                        piece = "##" + piece
                    if piece in self.vocab:
                        found = piece
                        break
                    end -= 1
                if found is None:
                    bad = True
                    break
                sub_tokens.append(found)
                start = end
            if bad:
                output_tokens.append(self.unk_token)
            else:
                output_tokens.extend(sub_tokens)
        return output_tokens


class FullTokenizer:
    def __init__(self, vocab_file, do_lower_case):
        self.vocab = load_vocab(vocab_file)
        self.basic_tokenizer = BasicTokenizer(do_lower_case)
        self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab)

    def tokenize(self, text):
        out = []
        for token in self.basic_tokenizer.tokenize(text):
            out.extend(self.wordpiece_tokenizer.tokenize(token))
        return out

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab[t] for t in tokens]


def main():
    vocab_file, lower, corpus_file = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    tok = FullTokenizer(vocab_file, lower)
    with open(corpus_file, "r", encoding="utf-8") as f:
        corpus = json.load(f)
    out = []
    for text in corpus:
        tokens = tok.tokenize(text)
        out.append({"tokens": tokens, "ids": tok.convert_tokens_to_ids(tokens)})
    json.dump({"unidata_version": unicodedata.unidata_version, "results": out}, sys.stdout)


if __name__ == "__main__":
    main()

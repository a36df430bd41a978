#!/usr/bin/env python3
# The reference byte-level BPE tokenizer for TestBPEConformance.
#
# It restates, step for step and with the same function names,
# bytes_to_unicode, get_pairs and Encoder.bpe/encode of openai/gpt-2,
# src/encoder.py at commit 9b63575ef42771a015060c964af2c3da4cf7c8ab (the
# file as last changed by e5c5054; MIT License, Copyright (c) 2019
# OpenAI). It is written for this test, not copied. It needs the regex
# module (Debian's python3-regex), whose \p{L}, \p{N} and lookahead the
# pattern uses, as the reference does.
#
# The merges are read as get_encoder reads vocab.bpe: the first line is
# the "#version" header and the text after the last newline is dropped,
# so the test writes a header and a final newline.
#
# Usage: gpt2_bpe.py VOCAB_JSON MERGES_TXT CORPUS_JSON
# CORPUS_JSON is a JSON list of strings; the output, on stdout, is a JSON
# object whose "results" list has, for each string,
# {"pieces": [...], "tokens": [...], "ids": [...]}.

import json
import sys
import unicodedata

import regex

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    """Each byte's symbol: the printable bytes are their own code point,
    the other 68 take 256, 257, ... in byte order."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


def get_pairs(word):
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


class Encoder:
    def __init__(self, encoder, bpe_merges):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = {m: i for i, m in enumerate(bpe_merges)}
        self.cache = {}
        self.pat = regex.compile(PATTERN)

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        inf = float("inf")
        while True:
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, inf))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                if word[i] == first and i + 1 < len(word) and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        result = " ".join(word)
        self.cache[token] = result
        return result

    def encode(self, text):
        pieces, tokens = [], []
        for piece in regex.findall(self.pat, text):
            pieces.append(piece)
            symbols = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            tokens.extend(self.bpe(symbols).split(" "))
        return pieces, tokens, [self.encoder[t] for t in tokens]


def get_encoder(vocab_file, merges_file):
    with open(vocab_file, "r", encoding="utf-8") as f:
        encoder = json.load(f)
    with open(merges_file, "r", encoding="utf-8") as f:
        data = f.read()
    merges = [tuple(line.split()) for line in data.split("\n")[1:-1]]
    return Encoder(encoder, merges)


def main():
    enc = get_encoder(sys.argv[1], sys.argv[2])
    with open(sys.argv[3], "r", encoding="utf-8") as f:
        corpus = json.load(f)
    out = []
    for text in corpus:
        pieces, tokens, ids = enc.encode(text)
        out.append({"pieces": pieces, "tokens": tokens, "ids": ids})
    json.dump({"unidata_version": unicodedata.unidata_version, "results": out}, sys.stdout)


if __name__ == "__main__":
    main()

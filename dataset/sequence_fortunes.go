package dataset

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// FortunesDir is where Debian's fortunes packages (main: fortunes,
// fortunes-min) install their text: one file per category, fortunes
// separated by lines holding "%" (`apt-get install fortunes`).
const FortunesDir = "/usr/share/games/fortunes"

// NameFortunesSeq is the built-in next-token dataset (RunOptions.Dataset):
// the fortunes in FortunesDir (or RunOptions.Dir), one document each,
// tokenized by the ByteTokenizer, split 80/10/10 by document with
// DefaultSequenceSeed, cut into windows of the model's input length.
// fortunes 1:1.99.1-7.3 holds 15,2xx fortunes, 2.6 MB of text.
const NameFortunesSeq = "fortunes-seq"

// maxFortuneFileBytes bounds one fortune file: Debian's largest is under
// 500 kB.
const maxFortuneFileBytes = 64 << 20

// ParseFortunes splits the text of a fortune file into its fortunes: the
// runs of lines between lines that hold only "%" (and white space, once
// overstriking is removed). A
// fortune's text is its lines joined by "\n" (split at "\n" only, so any
// other byte, "\r" included, is kept); backspace overstriking ("_\bx", the
// files' underlining) is removed, a backspace deleting the character (UTF-8
// sequence) before it on its line. Fortunes holding only white space are
// dropped. It never fails: any bytes are some text.
func ParseFortunes(data []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	lines := 0
	flush := func() {
		if len(bytes.TrimSpace(cur)) > 0 {
			docs = append(docs, cur)
		}
		cur, lines = nil, 0
	}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		mark := len(cur)
		if lines > 0 {
			cur = append(cur, '\n')
		}
		cur = appendOverstruck(cur, line)
		if string(bytes.TrimSpace(cur[mark:])) == "%" { // a separator, once overstruck
			cur = cur[:mark]
			flush()
			continue
		}
		lines++
	}
	flush()
	return docs
}

// appendOverstruck appends line to dst with backspace overstriking
// removed: a backspace deletes the UTF-8 sequence before it on the line,
// or nothing at the line's start.
func appendOverstruck(dst, line []byte) []byte {
	start := len(dst)
	for _, b := range line {
		if b != '\b' {
			dst = append(dst, b)
			continue
		}
		if len(dst) > start {
			_, size := utf8.DecodeLastRune(dst[start:])
			dst = dst[:len(dst)-size]
		}
	}
	return dst
}

// FortuneFile is one fortune file: its name (the category, "people")
// and its fortunes.
type FortuneFile struct {
	Name string
	Docs [][]byte
}

// ReadFortuneFiles reads every fortune file in dir, in name order: the
// regular files without a dot in their name ("people", not "people.dat"
// or the "people.u8" links), each split by ParseFortunes. It fails if dir
// cannot be read, a file is larger than 64 MiB, or there is no fortune.
func ReadFortuneFiles(dir string) ([]FortuneFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("dataset: fortunes: %w (install the Debian package fortunes)", err)
	}
	var files []FortuneFile
	n := 0
	for _, e := range ents { // os.ReadDir sorts by name
		if !e.Type().IsRegular() || strings.Contains(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, _, err := openData(path)
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(io.LimitReader(f, maxFortuneFileBytes+1))
		f.Close()
		if err != nil {
			return nil, fileOpenErr(path, err)
		}
		if len(data) > maxFortuneFileBytes {
			return nil, formatErr(path, nil, "larger than %d bytes: not a fortune file", maxFortuneFileBytes)
		}
		docs := ParseFortunes(data)
		n += len(docs)
		files = append(files, FortuneFile{Name: e.Name(), Docs: docs})
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: %s holds no fortunes (install the Debian package fortunes)", ErrSequence, dir)
	}
	return files, nil
}

// ReadFortunes reads every fortune in dir (ReadFortuneFiles), the files'
// fortunes one after the other.
func ReadFortunes(dir string) ([][]byte, error) {
	files, err := ReadFortuneFiles(dir)
	if err != nil {
		return nil, err
	}
	var docs [][]byte
	for _, f := range files {
		docs = append(docs, f.Docs...)
	}
	return docs, nil
}

// LoadFortunesSequences reads the fortunes in dir (FortunesDir if "") and
// cuts them into next-token splits by document (NewSequenceCorpus with
// c), named "fortunes-train", "fortunes-validation", "fortunes-test".
func LoadFortunesSequences(dir string, c SequenceConfig) (*SequenceCorpus, error) {
	if dir == "" {
		dir = FortunesDir
	}
	docs, err := ReadFortunes(dir)
	if err != nil {
		return nil, err
	}
	return NewSequenceCorpus("fortunes", docs, c)
}

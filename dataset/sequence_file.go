package dataset

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// A token file (extension .tokens, FormatTokens) holds a token dataset's
// rows, one example per row, for the next-token contract (labels are all
// 0). Its layout, little-endian:
//
//	offset 0   magic "DPCTOKS1"
//	offset 8   uint32 vocab     ids are in [-1, vocab); -1 is padding
//	offset 12  uint32 width     ids per row (T+1 for context T)
//	offset 16  uint64 rows
//	offset 24  rows×width int32 ids, row-major
//	end        uint32 CRC-32C (Castagnoli) of every byte before it
//
// The header says the sizes, so a reader checks them against the file's
// length and against the 2^28-value limit before allocating; the CRC
// catches a damaged or truncated file.
const (
	tokensMagic     = "DPCTOKS1"
	tokensHeaderLen = 24
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// WriteTokensFile writes d to path as a token file: through a temporary
// file in path's directory, fsynced, renamed over path, and the directory
// fsynced, so path holds either its old content or all of d; the file's
// mode is 0600 (training text is private). d must pass
// Validate, be a token dataset (Vocab > 0) and have every label 0 (the
// format stores no labels).
func WriteTokensFile(path string, d *Dataset) (err error) {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("dataset: write %s: %w", path, err)
	}
	if d.Vocab < 1 {
		return fmt.Errorf("dataset: write %s: %s is not token data (Vocab 0)", path, d.Name)
	}
	for i, y := range d.Y {
		if y != 0 {
			return fmt.Errorf("dataset: write %s: row %d has label %d; a token file holds next-token examples, whose labels are 0", path, i, y)
		}
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("dataset: write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := encodeTokens(f, d); err != nil {
		return fmt.Errorf("dataset: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("dataset: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("dataset: write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("dataset: write %s: %w", path, err)
	}
	return syncDir(dir)
}

// syncDir fsyncs the directory dir, so a rename in it is durable.
func syncDir(dir string) error {
	df, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("dataset: sync %s: %w", dir, err)
	}
	defer df.Close()
	if err := df.Sync(); err != nil {
		return fmt.Errorf("dataset: sync %s: %w", dir, err)
	}
	return nil
}

// encodeTokens writes d's token file bytes to w.
func encodeTokens(w io.Writer, d *Dataset) error {
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<16)
	var hdr [tokensHeaderLen]byte
	copy(hdr[:], tokensMagic)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(d.Vocab))
	binary.LittleEndian.PutUint32(hdr[12:], uint32(d.Dim))
	binary.LittleEndian.PutUint64(hdr[16:], uint64(d.Len()))
	bw.Write(hdr[:])
	var b [4]byte
	for _, v := range d.X {
		binary.LittleEndian.PutUint32(b[:], uint32(int32(v)))
		bw.Write(b[:])
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(b[:], crc.Sum32())
	_, err := w.Write(b[:])
	return err
}

// readTokensFile reads a token file (see WriteTokensFile) as ReadFile
// does, with o checked against it.
func readTokensFile(path string, o FileOptions) (*Dataset, error) {
	switch {
	case o.Labels != nil:
		return nil, optionsErr(path, "a token file's labels are all 0 (next-token examples): it takes no Labels")
	case o.LabelColumn != "" || o.FeatureColumns != nil:
		return nil, optionsErr(path, "LabelColumn and FeatureColumns are for CSV and Parquet files, not token files")
	}
	f, size, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, err := decodeTokens(f, size, path)
	if err != nil {
		return nil, err
	}
	if o.Vocab > 0 && o.Vocab != d.Vocab {
		return nil, formatErr(path, nil, "vocabulary %d, but the options say %d", d.Vocab, o.Vocab)
	}
	if o.SeqLen > 0 && o.SeqLen != d.Dim {
		return nil, formatErr(path, nil, "%d tokens per row, but the options say SeqLen %d", d.Dim, o.SeqLen)
	}
	if o.Classes > 0 {
		d.Classes = o.Classes // every label is 0, below any class count
	}
	return d, nil
}

// decodeTokens reads a token file of size bytes from r; name is the file
// in error messages. Every error wraps ErrFormat and names the file and,
// for a bad id, its row and position (from 0).
func decodeTokens(r io.Reader, size int64, name string) (*Dataset, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var hdr [tokensHeaderLen]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, formatErr(name, err, "not a token file: %d bytes, shorter than the %d-byte header", size, tokensHeaderLen)
	}
	if string(hdr[:8]) != tokensMagic {
		return nil, formatErr(name, nil, "not a token file: magic %s, want %q", strconv.QuoteToASCII(string(hdr[:8])), tokensMagic)
	}
	vocab := binary.LittleEndian.Uint32(hdr[8:])
	width := binary.LittleEndian.Uint32(hdr[12:])
	rows := binary.LittleEndian.Uint64(hdr[16:])
	switch {
	case vocab < 1 || vocab > MaxTokenID:
		return nil, formatErr(name, nil, "vocabulary %d outside [1, %d]", vocab, MaxTokenID)
	case width < 1 || uint64(width) > uint64(maxReadValues):
		return nil, formatErr(name, nil, "%d ids per row outside [1, %d]", width, maxReadValues)
	case rows < 1:
		return nil, formatErr(name, nil, "no rows")
	case rows > uint64(maxReadValues)/uint64(width):
		return nil, formatErr(name, nil, "%d rows of %d ids: more than %d values", rows, width, maxReadValues)
	}
	n := int(rows) * int(width)
	if want := int64(tokensHeaderLen) + 4*int64(n) + 4; size != want {
		return nil, formatErr(name, nil, "%d bytes, but its header (%d rows of %d ids) says %d: truncated or damaged", size, rows, width, want)
	}
	d := &Dataset{
		X: make([]float32, n), Y: make([]int32, rows),
		Dim: int(width), Shape: []int{int(width)}, Classes: 1, Vocab: int(vocab),
	}
	sum := crc32.Update(0, castagnoli, hdr[:])
	buf := make([]byte, 4*min(n, 1<<14))
	for i := 0; i < n; {
		chunk := buf[:4*min(n-i, len(buf)/4)]
		if _, err := io.ReadFull(br, chunk); err != nil {
			return nil, formatErr(name, err, "truncated at row %d: %v", i/d.Dim, err)
		}
		sum = crc32.Update(sum, castagnoli, chunk)
		for k := 0; k < len(chunk); k, i = k+4, i+1 {
			id := int32(binary.LittleEndian.Uint32(chunk[k:]))
			if id < PadToken || int64(id) >= int64(vocab) {
				return nil, formatErr(name, nil, "row %d, position %d: token id %d outside [-1, %d)", i/d.Dim, i%d.Dim, id, vocab)
			}
			d.X[i] = float32(id)
		}
	}
	var b [4]byte
	if _, err := io.ReadFull(br, b[:]); err != nil {
		return nil, formatErr(name, err, "truncated before its checksum: %v", err)
	}
	if got := binary.LittleEndian.Uint32(b[:]); got != sum {
		return nil, formatErr(name, nil, "checksum %08x, content's is %08x: the file is damaged", got, sum)
	}
	return d, nil
}

// SequenceFiles are the token files WriteSequenceCorpus wrote, with the
// rows (examples) each holds.
type SequenceFiles struct {
	Train, Validation, Test             string
	TrainRows, ValidationRows, TestRows int
	// TrainShards are the training documents dealt to the nodes, one file
	// each (nil when WriteSequenceCorpus was asked for one shard), and
	// ShardRows their rows, which add up to TrainRows.
	TrainShards []string
	ShardRows   []int
}

// WriteSequenceCorpus cuts docs into next-token splits (NewSequenceCorpus
// with c) and writes them as token files in dir: NAME-train.tokens,
// NAME-validation.tokens and NAME-test.tokens. With shards > 1 it also
// deals the training documents (not windows: a node holds whole
// documents) to shards files NAME-train-shard-I-of-K.tokens (I from 1),
// uniformly at random with c.Seed (ShardIndicesIID), for runs whose nodes
// each bring their own file. Every file is written atomically
// (WriteTokensFile). name must be a plain file name part.
func WriteSequenceCorpus(dir, name string, docs [][]byte, c SequenceConfig, shards int) (SequenceFiles, error) {
	var sf SequenceFiles
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		return sf, fmt.Errorf("%w: corpus name %q must be a plain file name part", ErrSequence, name)
	}
	if shards < 1 {
		return sf, fmt.Errorf("%w: %d shards: need at least 1", ErrSequence, shards)
	}
	sc, err := NewSequenceCorpus(name, docs, c)
	if err != nil {
		return sf, err
	}
	write := func(suffix string, d *Dataset) (string, int, error) {
		path := filepath.Join(dir, name+"-"+suffix+".tokens")
		return path, d.Len(), WriteTokensFile(path, d)
	}
	if sf.Train, sf.TrainRows, err = write("train", sc.Train); err != nil {
		return sf, err
	}
	if sf.Validation, sf.ValidationRows, err = write("validation", sc.Validation); err != nil {
		return sf, err
	}
	if sf.Test, sf.TestRows, err = write("test", sc.Test); err != nil {
		return sf, err
	}
	if shards == 1 {
		return sf, nil
	}
	parts, err := ShardIndicesIID(len(sc.TrainDocs), shards, c.Seed)
	if err != nil {
		return sf, fmt.Errorf("%w: %s: %d training documents: %v", ErrSequence, name, len(sc.TrainDocs), err)
	}
	ne := nonEmpty(docs)
	for i, part := range parts {
		idx := make([]int, len(part))
		for j, p := range part {
			idx[j] = sc.TrainDocs[p]
		}
		suffix := fmt.Sprintf("train-shard-%d-of-%d", i+1, shards)
		d, err := SequenceDataset(name+"-"+suffix, ne, idx, c.Context)
		if err != nil {
			return sf, err
		}
		path, rows, err := write(suffix, d)
		if err != nil {
			return sf, err
		}
		sf.TrainShards = append(sf.TrainShards, path)
		sf.ShardRows = append(sf.ShardRows, rows)
	}
	return sf, nil
}

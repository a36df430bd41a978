package dataset

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// rowKey identifies an example by its content: the first 128 bits of the
// SHA-256 of its label and features. Two different rows share a key with
// probability about 2⁻¹²⁸ per pair, far below any data set's size.
type rowKey [16]byte

// SharedRows returns how many of eval's rows are also rows of train: the
// same label and the same features, compared as the values read (so a
// copy of a file written with other number formatting, or in another
// format, still matches), with −0 equal to +0. A row that appears twice
// in eval counts twice. Datasets of different Dim share no rows.
//
// It hashes every training row into a set and looks each evaluation row
// up: O(train + eval) time and 16 bytes of key per training row (for
// Fashion-MNIST's 60000 images, about 1 MiB and a fraction of a second).
func SharedRows(train, eval *Dataset) int {
	if train.Dim != eval.Dim || train.Len() == 0 || eval.Len() == 0 {
		return 0
	}
	buf := make([]byte, 0, 4*(train.Dim+1))
	key := func(d *Dataset, i int) rowKey {
		buf = binary.LittleEndian.AppendUint32(buf[:0], uint32(d.Y[i]))
		for _, v := range d.Row(i) {
			if v == 0 {
				v = 0 // −0 and +0 are the same value
			}
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
		sum := sha256.Sum256(buf)
		return rowKey(sum[:16])
	}
	seen := make(map[rowKey]struct{}, train.Len())
	for i := range train.Len() {
		seen[key(train, i)] = struct{}{}
	}
	n := 0
	for i := range eval.Len() {
		if _, ok := seen[key(eval, i)]; ok {
			n++
		}
	}
	return n
}

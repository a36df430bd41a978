package ledgerreport

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dpcluster/dpcluster/ledger"
)

// ErrFormat is returned for a report file whose extension names no
// format this package writes (.html, .htm or .png).
var ErrFormat = errors.New("ledgerreport: unknown report format")

// Format is a report's file format.
type Format string

// The formats, chosen by the file's extension (FormatOf).
const (
	FormatHTML Format = "html"
	FormatPNG  Format = "png"
)

// FormatOf returns the format the extension of path names, in any case:
// FormatHTML for .html and .htm, FormatPNG for .png, and an error wrapping
// ErrFormat for anything else.
func FormatOf(path string) (Format, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".html", ".htm":
		return FormatHTML, nil
	case ".png":
		return FormatPNG, nil
	default:
		return "", fmt.Errorf("%w: %q (want a file ending in .html or .png)", ErrFormat, path)
	}
}

// WriteFile renders the report in the format path's extension names
// (FormatOf) and writes it to path, replacing the file. It renders in
// memory first, so an error leaves no partial file; an unknown extension
// returns an error wrapping ErrFormat and writes nothing.
func WriteFile(path string, tl ledger.Timeline, rep ledger.AuditReport) error {
	f, err := FormatOf(path)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	switch f {
	case FormatHTML:
		err = HTML(&b, tl, rep)
	case FormatPNG:
		err = PNG(&b, tl)
	}
	if err != nil {
		return fmt.Errorf("ledgerreport: rendering %s: %w", path, err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

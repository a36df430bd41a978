package dpcluster

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxFileLines is the most lines a hand-written, non-test Go file may have
// (issue 28): past it a file has usually grown by accretion and holds more
// than one concern.
const maxFileLines = 700

// tooLong lists the files still over maxFileLines, with their length when
// they were listed. The list may only shrink: TestFileLengths fails for a
// file over the limit that is not listed, for a listed file that has grown
// past its length here, and for a listed file now within the limit (or
// gone), so that its entry is removed once it is split.
var tooLong = map[string]int{}

// TestFileLengths walks every Go file of the module that is neither a test
// nor generated ("// Code generated" on its first line) and reports those
// over maxFileLines that tooLong does not list, and the tooLong entries no
// longer over it. Nested modules (experiments/), testdata and hidden
// directories are not the module's code and are skipped.
func TestFileLengths(t *testing.T) {
	lengths := goFileLengths(t, ".")
	var over []string
	for path, n := range lengths {
		if n > maxFileLines {
			over = append(over, path)
		}
	}
	slices.Sort(over)
	for _, path := range over {
		if _, ok := tooLong[path]; !ok {
			t.Errorf("%s has %d lines, over %d: split it along its seams (one concern a file)", path, lengths[path], maxFileLines)
		}
	}
	for _, path := range slices.Sorted(maps.Keys(tooLong)) {
		n, ok := lengths[path]
		switch {
		case !ok:
			t.Errorf("%s is listed in tooLong but is not a hand-written Go file of the module: remove its entry", path)
		case n <= maxFileLines:
			t.Errorf("%s has %d lines, within %d: remove its entry from tooLong", path, n, maxFileLines)
		case n > tooLong[path]:
			t.Errorf("%s has grown from %d to %d lines, over %d: split it rather than grow it", path, tooLong[path], n, maxFileLines)
		}
	}
}

// maxFuncLines is the most lines a function (or method) of the packages
// in funcLengthPackages may span, its signature and closing brace
// included (issue 28): the packages a reviewer reads step by step.
const maxFuncLines = 80

// funcLengthPackages are the directories whose functions maxFuncLines
// bounds.
var funcLengthPackages = []string{"coordinator", "node", "ledger", "accounting"}

// TestFunctionLengths parses every hand-written, non-test Go file of
// funcLengthPackages (their subpackages too) and reports each function
// longer than maxFuncLines.
func TestFunctionLengths(t *testing.T) {
	fset := token.NewFileSet()
	n := 0
	for _, dir := range funcLengthPackages {
		for path := range goFileLengths(t, dir) {
			file := filepath.Join(dir, filepath.FromSlash(path))
			f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				n++
				lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
				if lines > maxFuncLines {
					t.Errorf("%s: %s has %d lines, over %d: split it along its steps", filepath.ToSlash(file), fd.Name.Name, lines, maxFuncLines)
				}
			}
		}
	}
	if n < 100 {
		t.Fatalf("only %d functions found in %v: the walk is broken", n, funcLengthPackages)
	}
}

// goFileLengths returns the number of lines of each non-test, non-generated
// Go file of the module rooted at root, by slash-separated path relative to
// root.
func goFileLengths(t *testing.T, root string) map[string]int {
	t.Helper()
	out := make(map[string]int)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDir(path, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if generated(b) {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		out[filepath.ToSlash(rel)] = countLines(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no Go files under %s", root)
	}
	return out
}

// skipDir reports whether the directory at path, named name, holds no Go
// code of this module: a hidden directory, testdata, or a nested module.
func skipDir(path, name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" {
		return true
	}
	_, err := os.Stat(filepath.Join(path, "go.mod"))
	return err == nil
}

// generated reports whether the Go source b says on its first line that it
// is generated (https://go.dev/s/generatedcode).
func generated(b []byte) bool {
	first, _, _ := bytes.Cut(b, []byte("\n"))
	return bytes.HasPrefix(first, []byte("// Code generated ")) && bytes.HasSuffix(bytes.TrimRight(first, "\r"), []byte(" DO NOT EDIT."))
}

// countLines counts lines as wc -l does, plus a last line without a newline.
func countLines(b []byte) int {
	n := bytes.Count(b, []byte("\n"))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

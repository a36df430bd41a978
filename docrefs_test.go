package dpcluster

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// mdPath matches a path to a Markdown document as prose cites it: a
	// path with a directory (docs/PRIVACY.md, or one up from docs/ to
	// deploy/README.md), or a document's bare name, which the repository
	// writes in capitals (PROTOCOL.md). A bare name in lower case
	// (table.md) is a file a program writes, not a document it cites.
	mdPath = regexp.MustCompile(`(?:\.{1,2}/)*[A-Za-z0-9_-][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_.-]+)+\.md\b|\b[A-Z][A-Z0-9_-]*\.md\b`)
	// url matches a URL, whose path is not the repository's.
	url = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s)>\]]+`)
	// mdLink matches the target of a Markdown link or image, inline
	// [text](target) or a reference definition [label]: target.
	mdLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)|(?m)^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
)

// TestCitedDocumentsExist checks that every Markdown document cited in a Go
// comment or a Markdown file of the repository exists in it (issue 28: the
// map is inside the repository, not in a design document beside the
// checkout that a clone lacks).
//
//   - A Markdown link's target (a path, not a URL) resolves relative to the
//     file holding the link, as a Markdown viewer resolves it; every local
//     target is checked, documents or not.
//   - A path cited in prose (Go comments, Markdown text and code) resolves
//     relative to the citing file's directory or the repository root
//     ("docs/PRIVACY.md" from any package); a bare name (PROTOCOL.md) may
//     also name a document in docs/.
//
// A path that leaves the repository (up into ../shared, say) is an error
// even if it exists on this machine.
func TestCitedDocumentsExist(t *testing.T) {
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		var cites []citation
		switch filepath.Ext(path) {
		case ".go":
			cites, err = goCitations(path)
		case ".md":
			cites, err = markdownCitations(path)
		default:
			return nil
		}
		if err != nil {
			return err
		}
		for _, c := range cites {
			checked++
			if why := resolve(root, filepath.Dir(path), c); why != "" {
				t.Errorf("%s:%d cites %s: %s", filepath.ToSlash(rel), c.line, c.path, why)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Errorf("only %d citations found: the scan has lost its way", checked)
	}
}

// citation is a path cited on a line of a file; link says it is a
// Markdown link's target.
type citation struct {
	path string
	line int
	link bool
}

// goCitations returns the Markdown paths cited in the comments of the Go
// file at path.
func goCitations(path string) ([]citation, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []citation
	for _, g := range f.Comments {
		for _, c := range g.List {
			line := fset.Position(c.Pos()).Line
			for i, text := range strings.Split(c.Text, "\n") {
				for _, p := range mdPath.FindAllString(url.ReplaceAllString(text, ""), -1) {
					out = append(out, citation{path: p, line: line + i})
				}
			}
		}
	}
	return out, nil
}

// markdownCitations returns the link targets and the Markdown paths cited
// in the prose of the Markdown file at path.
func markdownCitations(path string) ([]citation, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []citation
	for i, text := range strings.Split(string(b), "\n") {
		links := make(map[string]bool)
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1] + m[2]
			if target, _, _ = strings.Cut(target, "#"); target == "" || url.MatchString(target) || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if !links[target] {
				links[target] = true
				out = append(out, citation{path: target, line: i + 1, link: true})
			}
		}
		for _, p := range mdPath.FindAllString(url.ReplaceAllString(text, ""), -1) {
			if !links[p] { // a link's target, checked as a link
				out = append(out, citation{path: p, line: i + 1})
			}
		}
	}
	return out, nil
}

// resolve returns why c, cited by a file in dir, does not name a file in
// the repository at root, or "".
func resolve(root, dir string, c citation) string {
	if filepath.IsAbs(c.path) {
		return "an absolute path"
	}
	candidates := []string{filepath.Join(dir, c.path)}
	if !c.link {
		candidates = append(candidates, filepath.Join(root, c.path))
		if !strings.Contains(c.path, "/") {
			candidates = append(candidates, filepath.Join(root, "docs", c.path))
		}
	}
	outside := false
	for _, p := range candidates {
		if r, err := filepath.Rel(root, p); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
			outside = true
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return ""
		}
	}
	if outside {
		return "outside the repository"
	}
	if c.link {
		return "no such file (a link resolves relative to its file)"
	}
	return "no such file in the repository"
}

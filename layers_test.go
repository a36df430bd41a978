package dpcluster

import (
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layers is the module's dependency picture, bottom first
// (docs/ARCHITECTURE.md, "Layers"): a package may import packages of its
// own layer or of layers below, never above. Every package of the module
// is in exactly one layer, so a new package must be placed here.
var layers = [][]string{
	// Leaves: no import of the module, or only of another leaf.
	{"internal/durable", "internal/parallel", "internal/f32le", "internal/handoff", "internal/procstat", "internal/conformance",
		"internal/faultnet", "internal/brokenmech", "internal/torchref", "seed", "sampling", "accounting", "model/kernels", "privacyaudit",
		"tokenizer"},
	// Foundations: identities, data, pretrained checkpoints, the
	// optimizer, the noise, the durable logs.
	{"pki", "dataset", "checkpoint", "dpadam", "mechanism", "ledger", "raftlog", "transport/fake"},
	// The wire, the models and one round's arithmetic.
	{"transport", "raftnet", "model", "model/backendtest", "pretrained", "aggregation", "transport/transporttest"},
	// The roles: a node, the replicated coordinator, in-process training.
	{"node", "coordinator", "train"},
	// What is built around the roles.
	{"coordinator/coordinatortest", "coordinator/dashboard", "cli/ledgerreport"},
	// The commands.
	{"cli"},
	// Binaries, benchmarks, examples, the process tests and the module's
	// own checks.
	{"cmd/coordinator", "cmd/node", "bench/step", "examples/fashion-mlp", "e2e", "e2e/natsserver", "."},
}

// TestImportsPointDown reads the imports of every non-test Go file of the
// module, whatever its build tags (experiments/ is its own module), and
// fails for an import of a package in a higher layer than the importer's,
// and for a package that no layer lists. Tests may reach up (pki's tests
// check a node's certificate use against the node package).
func TestImportsPointDown(t *testing.T) {
	const module = "github.com/dpcluster/dpcluster"
	rank := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			if _, dup := rank[p]; dup {
				t.Errorf("%s is listed in two layers", p)
			}
			rank[p] = i
		}
	}
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (d.Name() == "testdata" || d.Name() == "experiments" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		seen[pkg] = true
		from, ok := rank[pkg]
		if !ok {
			return nil // reported once below
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		file, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range file.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			dep, ok := strings.CutPrefix(p, module+"/")
			if !ok {
				continue
			}
			to, known := rank[dep]
			if known && to > from {
				t.Errorf("%s (layer %d) imports %s (layer %d), a layer above it", path, from, dep, to)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range slices.Sorted(maps.Keys(seen)) {
		if _, ok := rank[pkg]; !ok {
			t.Errorf("package %s is in no layer: place it in layers", pkg)
		}
	}
	for p := range rank {
		if !seen[p] {
			t.Errorf("layers lists %s, which has no Go file", p)
		}
	}
}

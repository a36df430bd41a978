package coordinator

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDependenciesPointOneWay: the coordinator depends on the mechanism,
// the ledger, aggregation and the wire, never on the training side (train,
// model, dataset, sampling, node) or the command line, directly or through
// another package of this module (issue 13); of the internal packages it
// may use only five leaves: internal/handoff (the handler-to-loop gate node
// shares), internal/durable (crash-safe file writes, shared with the
// ledger and the PKI), internal/parallel (loops over model-sized
// vectors on several cores, shared with aggregation and dpadam),
// internal/f32le (the little-endian tensor encoding of the log, the
// snapshots, the optimizer's state and the wire) and internal/brokenmech
// (the audit test's breakages, shared with model's clip rule; constant
// off without its build tag). Imports are read from the source of every
// non-test file, whatever its build tags.
func TestDependenciesPointOneWay(t *testing.T) {
	allowedInternal := map[string]bool{"internal/handoff": true, "internal/durable": true, "internal/parallel": true,
		"internal/f32le": true, "internal/brokenmech": true}
	const module = "github.com/dpcluster/dpcluster/"
	forbidden := map[string]bool{"train": true, "model": true, "dataset": true, "sampling": true, "node": true}
	root := ".."
	seen := map[string]bool{}
	var visit func(rel string, via []string)
	visit = func(rel string, via []string) {
		if seen[rel] {
			return
		}
		seen[rel] = true
		if forbidden[rel] || strings.HasPrefix(rel, "internal/") && !allowedInternal[rel] {
			t.Errorf("coordinator depends on %s (via %s)", rel, strings.Join(via, " → "))
			return
		}
		files, err := filepath.Glob(filepath.Join(root, rel, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("package %s: no Go files (%v)", rel, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range file.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if dep, ok := strings.CutPrefix(p, module); ok {
					visit(dep, append(via[:len(via):len(via)], dep))
				}
			}
		}
	}
	visit("coordinator", []string{"coordinator"})
	if !seen["mechanism"] || !seen["seed"] {
		t.Errorf("the walk missed the coordinator's known dependencies: %v", seen)
	}
}

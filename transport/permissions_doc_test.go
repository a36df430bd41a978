package transport

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/pki"
)

// TestSecurityDocPermissionsTable: docs/SECURITY.md's table of what each
// role may publish and subscribe to is the server's (Permissions) for run
// RUN and ID ID, subject for subject (issue 27: the doc said a node
// subscribes to nack.node.ID.> where the server grants nack.node.ID.*.>).
func TestSecurityDocPermissionsTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSubjects("RUN")
	if err != nil {
		t.Fatal(err)
	}
	subject := regexp.MustCompile("`(dpc\\.[^`]*)`")
	subjects := func(cell string) []string {
		var out []string
		for _, m := range subject.FindAllStringSubmatch(cell, -1) {
			out = append(out, m[1])
		}
		slices.Sort(out)
		return out
	}
	rows := map[pki.Role]string{pki.RoleReplica: "| replica (any ID) |", pki.RoleNode: "| node `ID` |", pki.RoleObserver: "| observer `ID` |"}
	for role, prefix := range rows {
		var row string
		for _, line := range strings.Split(string(doc), "\n") {
			if strings.HasPrefix(line, prefix) {
				row = line
			}
		}
		cells := strings.Split(row, "|")
		if len(cells) < 4 {
			t.Fatalf("docs/SECURITY.md has no table row %q", prefix)
		}
		pub, sub := s.Permissions(role, "ID")
		// The ID placeholder stands for the certificate's ID; the
		// server's client IDs put a nonce after it (ROLE.ID.*).
		slices.Sort(pub)
		slices.Sort(sub)
		if got := subjects(cells[2]); !slices.Equal(got, pub) {
			t.Errorf("%s may publish: the doc says %q, the server grants %q", role, got, pub)
		}
		if got := subjects(cells[3]); !slices.Equal(got, sub) {
			t.Errorf("%s may subscribe: the doc says %q, the server grants %q", role, got, sub)
		}
	}
}

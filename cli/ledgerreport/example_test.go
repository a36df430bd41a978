package ledgerreport_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/cli/ledgerreport"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// Example charges three steps to a ledger, the third after a new Raft
// term, and draws the audit report.
func Example() {
	dir, err := os.MkdirTemp("", "ledgerreport")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "ledger.log")
	l, err := ledger.Open(path)
	if err != nil {
		panic(err)
	}
	const history = "0123456789abcdef0123456789abcdef"
	if err := l.Start("example", 3, 1e-5, seed.Crypto, ledger.MechanismFloat, ledger.AccountantRDP, history); err != nil {
		panic(err)
	}
	for i, term := range []uint64{2, 2, 3} {
		pos := ledger.Position{History: history, Term: term, Index: uint64(3 + 2*i)}
		if _, err := l.Charge(int64(i+1), accounting.SubsampledGaussian(0.01, 1.1), pos, false); err != nil {
			panic(err)
		}
	}
	l.Close()

	recs, _, err := ledger.ReadFile(path)
	if err != nil {
		panic(err)
	}
	tl, err := ledger.NewTimeline(recs)
	if err != nil {
		panic(err)
	}
	rep, err := ledger.Audit(path)
	if err != nil {
		panic(err)
	}
	var page bytes.Buffer
	if err := ledgerreport.HTML(&page, tl, rep); err != nil {
		panic(err)
	}
	fmt.Println("audit ok:", rep.OK)
	fmt.Println("points:", len(tl.Points), "new terms:", tl.Count(ledger.MarkNewTerm))
	fmt.Println("new-term lines drawn:", strings.Count(page.String(), `class="new-term"`))
	// Output:
	// audit ok: true
	// points: 3 new terms: 1
	// new-term lines drawn: 1
}

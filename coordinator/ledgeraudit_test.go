package coordinator

import (
	"testing"

	"github.com/dpcluster/dpcluster/ledger"
)

// auditDataDir audits the ledger of the data dir dir against its Raft
// state (ReadLedger), as `coordinator ledger audit DIR` does.
func auditDataDir(t *testing.T, dir string) ledger.AuditReport {
	t.Helper()
	rd, err := ReadLedger(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rd.Options.Raft == nil || rd.Options.Raft.Unavailable != "" || rd.Options.Raft.Failed != "" {
		t.Fatalf("%s: no replay of the Raft state: %+v", dir, rd.Options.Raft)
	}
	return rd.Audit()
}

package coordinator

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestFSMDataBindings: a bind entry binds a node ID to its data's content
// hash; the first binding of an ID stands; an entry naming no node or no
// valid hash binds nothing (refused, the replica goes on); and the
// bindings survive a snapshot, so a restarted or lagging replica refuses
// the ID's other data as the others do.
func TestFSMDataBindings(t *testing.T) {
	a := newTestFSM(t, t.TempDir())
	c := testRunConfig()
	mustApply(t, a, logEntry(t, 1, entryConfig, c))
	h1, h2 := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	if res := mustApply(t, a, logEntry(t, 2, entryBind, bindEntry{Node: "n0", Data: h1})); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := mustApply(t, a, logEntry(t, 3, entryBind, bindEntry{Node: "n0", Data: h2})); res.Err != nil {
		t.Fatal(res.Err)
	}
	for i, bad := range []bindEntry{{Node: "", Data: h1}, {Node: "n1", Data: "not-a-hash"}, {Node: "n1"}} {
		if res := mustApply(t, a, logEntry(t, uint64(4+i), entryBind, bad)); !errors.Is(res.Err, ErrBadEntry) {
			t.Errorf("bind entry %+v: %v, want ErrBadEntry", bad, res.Err)
		}
	}
	if st := a.State(); st.Fatal != nil {
		t.Fatalf("a bad bind entry failed the replica: %v", st.Fatal)
	}
	if h, ok := a.DataBinding("n0"); !ok || h != h1 {
		t.Errorf("n0 bound to %q (%v), want the first binding %s", h, ok, h1)
	}
	if _, ok := a.DataBinding("n1"); ok {
		t.Error("a refused entry bound n1")
	}
	b := newTestFSM(t, t.TempDir())
	if err := b.Restore(readCloser{bytes.NewReader(persistSnapshot(t, a))}); err != nil {
		t.Fatal(err)
	}
	if h, ok := b.DataBinding("n0"); !ok || h != h1 {
		t.Errorf("after a snapshot restore n0 is bound to %q (%v), want %s", h, ok, h1)
	}
}

// TestCheckBinding: a node whose ID is bound is admitted only with the
// bound hash; an unbound ID with any valid hash or none; a hash that is
// not 64 lowercase hex digits never.
func TestCheckBinding(t *testing.T) {
	h1, h2 := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	for _, tc := range []struct {
		bound   string
		isBound bool
		report  string
		want    string
	}{
		{"", false, h1, ""},
		{"", false, "", ""},
		{h1, true, h1, ""},
		{h1, true, h2, rejectDataHash},
		{h1, true, "", rejectDataHash},
		{"", false, "A1" + h1[2:], rejectDataHash},
	} {
		if got := checkBinding(tc.bound, tc.isBound, nodeReport{id: "n", dataHash: tc.report}); got != tc.want {
			t.Errorf("bound %q (%v), report %q: %q, want %q", tc.bound, tc.isBound, tc.report, got, tc.want)
		}
	}
}

package ledger

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/seed"
)

// TestTimeline charges a real ledger file through a replay and two new
// terms (the second opened by a replay) and checks the timeline read back.
func TestTimeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const history = "7e57ea7e57ea7e57ea7e57ea7e57ea7e"
	if err := l.Start("timeline", 10, 1e-5, seed.Crypto, MechanismFloat, AccountantRDP, history); err != nil {
		t.Fatal(err)
	}
	charges := []struct {
		step   int64
		term   uint64
		index  uint64
		replay bool
	}{{1, 2, 3, false}, {2, 2, 4, false}, {2, 2, 5, true}, {3, 2, 6, false}, {4, 3, 9, false}, {4, 5, 12, true}, {5, 5, 13, false}}
	var eps []float64
	for _, c := range charges {
		r, err := l.Charge(c.step, accounting.SubsampledGaussian(0.01, 1.1), Position{History: history, Term: c.term, Index: c.index}, c.replay)
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, r.Epsilon)
	}
	recs, _, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := NewTimeline(recs)
	if err != nil {
		t.Fatal(err)
	}
	if tl.Run != "timeline" || tl.TargetEpsilon != 10 || tl.Delta != 1e-5 || len(tl.Points) != len(charges) {
		t.Fatalf("timeline %+v, want run timeline, ε 10, δ 1e-5, %d points", tl, len(charges))
	}
	for i, p := range tl.Points {
		c := charges[i]
		if p.Seq != uint64(i+2) || p.Step != c.step || p.Term != c.term || p.Index != c.index || p.Replay != c.replay || p.Epsilon != eps[i] {
			t.Errorf("point %d = %+v, want charge %+v with ε %v", i, p, c, eps[i])
		}
	}
	want := []Mark{
		{Kind: MarkReplay, Seq: 4, Step: 2, Point: 2, Term: 2},
		{Kind: MarkNewTerm, Seq: 6, Step: 4, Point: 4, Term: 3, PrevTerm: 2},
		{Kind: MarkNewTerm, Seq: 7, Step: 4, Point: 5, Term: 5, PrevTerm: 3},
		{Kind: MarkReplay, Seq: 7, Step: 4, Point: 5, Term: 5},
	}
	if !slices.Equal(tl.Marks, want) {
		t.Errorf("marks\n%+v\nwant\n%+v", tl.Marks, want)
	}
	if tl.Count(MarkReplay) != 2 || tl.Count(MarkNewTerm) != 2 {
		t.Errorf("counts: %d replays, %d new terms; want 2 and 2", tl.Count(MarkReplay), tl.Count(MarkNewTerm))
	}

	if _, err := NewTimeline(recs[1:]); !errors.Is(err, ErrCorrupt) {
		t.Errorf("timeline without the run record: %v, want ErrCorrupt", err)
	}
	if _, err := NewTimeline(nil); !errors.Is(err, ErrCorrupt) {
		t.Errorf("timeline of nothing: %v, want ErrCorrupt", err)
	}
}

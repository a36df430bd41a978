package aggregation

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

var nodes3 = []string{"a", "b", "c"}

func vec(vals ...float32) []float32 { return vals }

// valid returns a valid contribution of node for step 1, round 7: count 2,
// sum of norm ≤ 2 for clip norm 1.
func valid(node string, x float32) Contribution {
	return Contribution{NodeID: node, Step: 1, RoundID: 7, Count: 2, Sum: vec(x, 0.5, -0.25, 0)}
}

func newTestRound(t *testing.T) *Round {
	t.Helper()
	r, err := NewRound(1, nodes3, 4, 1.0, time.Now().Add(time.Hour), WithRoundID(7),
		WithShardSizes(map[string]int64{"a": 10, "b": 10, "c": 10}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestRejections(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(-1))
	cases := []struct {
		name  string
		setup func(r *Round) // run before the bad contribution
		bad   Contribution
		want  error
		why   Reason
	}{
		{"wrong step", nil, Contribution{NodeID: "a", Step: 2, RoundID: 7, Count: 1, Sum: vec(0, 0, 0, 0)}, ErrWrongStep, ReasonWrongStep},
		{"wrong round", nil, Contribution{NodeID: "a", Step: 1, RoundID: 8, Count: 1, Sum: vec(0, 0, 0, 0)}, ErrWrongRound, ReasonWrongRound},
		{"unknown node", nil, Contribution{NodeID: "z", Step: 1, RoundID: 7, Count: 1, Sum: vec(0, 0, 0, 0)}, ErrUnknownNode, ReasonUnknownNode},
		{"duplicate", func(r *Round) { mustAdd(t, r, valid("a", 1)) }, valid("a", 0.5), ErrDuplicate, ReasonDuplicate},
		{"short dimension", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 1, Sum: vec(0, 0, 0)}, ErrDimension, ReasonDimension},
		{"long dimension", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 1, Sum: vec(0, 0, 0, 0, 0)}, ErrDimension, ReasonDimension},
		{"nil sum", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 0}, ErrDimension, ReasonDimension},
		{"negative count", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: -1, Sum: vec(0, 0, 0, 0)}, ErrNegativeCount, ReasonNegativeCount},
		{"count above shard", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 11, Sum: vec(0, 0, 0, 0)}, ErrCountTooLarge, ReasonCountTooLarge},
		{"NaN", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 3, Sum: vec(0, nan, 0, 0)}, ErrNaN, ReasonNaN},
		{"NaN and Inf", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 3, Sum: vec(inf, nan, 0, 0)}, ErrNaN, ReasonNaN},
		{"Inf", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 3, Sum: vec(0, 0, 0, inf)}, ErrInf, ReasonInf},
		{"norm bound", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 1, Sum: vec(0.8, 0.61, 0, 0)}, ErrNormBound, ReasonNormBound},
		{"zero count nonzero sum", nil, Contribution{NodeID: "a", Step: 1, RoundID: 7, Count: 0, Sum: vec(0, 0, 1e-30, 0)}, ErrNormBound, ReasonNormBound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRound(t)
			if tc.setup != nil {
				tc.setup(r)
			}
			err := r.Add(tc.bad)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Add error %v, want %v", err, tc.want)
			}
			if got := ReasonOf(err); got != tc.why {
				t.Errorf("ReasonOf = %v, want %v", got, tc.why)
			}
			// The round is still usable: every node's valid contribution
			// is accepted and the sum is right.
			for _, n := range nodes3 {
				if tc.setup != nil && n == "a" {
					continue
				}
				mustAdd(t, r, valid(n, 1))
			}
			select {
			case <-r.Done():
			default:
				t.Fatal("round not closed after every node answered")
			}
			res := r.Close()
			if got, want := res.Sum, []float64{3, 1.5, -0.75, 0}; !slices.Equal(got, want) {
				t.Errorf("Sum = %v, want %v", got, want)
			}
			if res.Count != 6 || res.ClosedBy != CauseAllAnswered || len(res.Missing) != 0 {
				t.Errorf("Count %d, ClosedBy %v, Missing %v", res.Count, res.ClosedBy, res.Missing)
			}
			if got := res.RejectedByReason[tc.why]; got != 1 {
				t.Errorf("RejectedByReason[%v] = %d, want 1", tc.why, got)
			}
			if len(res.Rejected) != 1 || res.Rejected[0].Reason != tc.why || res.Rejected[0].Node != tc.bad.NodeID {
				t.Errorf("Rejected = %+v", res.Rejected)
			}
		})
	}
}

func mustAdd(t *testing.T, r *Round, c Contribution) {
	t.Helper()
	if err := r.Add(c); err != nil {
		t.Fatalf("Add(%s): %v", c.NodeID, err)
	}
}

// A rejected contribution does not use up the node's turn.
func TestRejectedNodeMayRetry(t *testing.T) {
	r := newTestRound(t)
	bad := valid("b", 1)
	bad.Sum = vec(float32(math.NaN()), 0, 0, 0)
	if err := r.Add(bad); !errors.Is(err, ErrNaN) {
		t.Fatalf("Add: %v", err)
	}
	mustAdd(t, r, valid("b", 1))
	res := r.Close()
	if !slices.Equal(res.Accepted, []string{"b"}) || !slices.Equal(res.Missing, []string{"a", "c"}) || res.ClosedBy != CauseClosed {
		t.Errorf("Accepted %v Missing %v ClosedBy %v", res.Accepted, res.Missing, res.ClosedBy)
	}
	if err := r.Add(valid("a", 1)); !errors.Is(err, ErrLate) {
		t.Errorf("Add after Close: %v, want ErrLate", err)
	}
	if got := r.Close(); !slices.Equal(got.Sum, res.Sum) || got.ClosedBy != CauseClosed {
		t.Error("second Close returned a different result")
	}
}

func TestLateAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r, err := NewRound(1, nodes3, 4, 1, start.Add(10*time.Second), WithRoundID(7))
		if err != nil {
			t.Fatal(err)
		}
		mustAdd(t, r, valid("a", 1))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		select {
		case <-r.Done():
		default:
			t.Fatal("round still open at its deadline")
		}
		if err := r.Add(valid("b", 1)); !errors.Is(err, ErrLate) || ReasonOf(err) != ReasonLate {
			t.Fatalf("late Add: %v", err)
		}
		res, err := r.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.ClosedBy != CauseDeadline || !slices.Equal(res.Accepted, []string{"a"}) || !slices.Equal(res.Missing, []string{"b", "c"}) {
			t.Errorf("ClosedBy %v Accepted %v Missing %v", res.ClosedBy, res.Accepted, res.Missing)
		}
		if !slices.Equal(res.Sum, []float64{1, 0.5, -0.25, 0}) || res.Count != 2 {
			t.Errorf("Sum %v Count %d", res.Sum, res.Count)
		}
	})
}

// Contributions arriving after the deadline but before the timer fires are
// late too.
func TestLateBeforeTimerFires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := NewRound(1, nodes3, 4, 1, time.Now().Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		r.mu.Lock() // hold off the timer's close
		r.deadline = time.Now()
		r.mu.Unlock()
		if err := r.Add(valid("a", 1)); !errors.Is(err, ErrLate) {
			t.Fatalf("Add at deadline: %v", err)
		}
		r.Close()
	})
}

func TestWaitContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := NewRound(1, nodes3, 4, 1, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := r.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait: %v", err)
		}
		go func() {
			for _, n := range nodes3 {
				_ = r.Add(Contribution{NodeID: n, Step: 1, Count: 1, Sum: vec(0, 0, 0, 1)})
			}
		}()
		res, err := r.Wait(context.Background())
		if err != nil || res.ClosedBy != CauseAllAnswered || res.Sum[3] != 3 {
			t.Fatalf("Wait: %+v, %v", res, err)
		}
	})
}

func TestEmptyAndPastRoundsCloseAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := NewRound(1, nil, 2, 1, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if res, _ := r.Wait(context.Background()); res.ClosedBy != CauseAllAnswered || len(res.Sum) != 2 {
			t.Errorf("empty round: %+v", res)
		}
		r, err = NewRound(1, nodes3, 2, 1, time.Now().Add(-time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if res, _ := r.Wait(context.Background()); res.ClosedBy != CauseDeadline {
			t.Errorf("past round: %+v", res)
		}
	})
}

func TestNewRoundInvalid(t *testing.T) {
	dl := time.Now().Add(time.Hour)
	cases := []struct {
		name  string
		nodes []string
		dim   int
		clip  float64
	}{
		{"zero dim", nodes3, 0, 1},
		{"zero clip", nodes3, 1, 0},
		{"NaN clip", nodes3, 1, math.NaN()},
		{"Inf clip", nodes3, 1, math.Inf(1)},
		{"empty node", []string{"a", ""}, 1, 1},
		{"duplicate node", []string{"a", "a"}, 1, 1},
	}
	for _, tc := range cases {
		if _, err := NewRound(1, tc.nodes, tc.dim, tc.clip, dl); !errors.Is(err, ErrInvalidRound) {
			t.Errorf("%s: err %v, want ErrInvalidRound", tc.name, err)
		}
	}
}

// The norm bound: n vectors of norm C in one direction sum to exactly n·C
// and pass; 1e-5 relative more fails; float32 extremes do not overflow.
func TestNormBoundEdges(t *testing.T) {
	const c = 1.5
	u := []float32{0.6, 0.8, 0} // unit vector
	mk := func(count int64, scale float64) []float32 {
		s := make([]float32, 3)
		for i := range s {
			s[i] = float32(float64(u[i]) * float64(count) * c * scale)
		}
		return s
	}
	cases := []struct {
		name  string
		count int64
		sum   []float32
		clip  float64
		want  error
	}{
		{"exactly n·C", 5, mk(5, 1), c, nil},
		{"within 1e-6 slack", 5, mk(5, 1+5e-7), c, nil},
		{"1e-5 over", 5, mk(5, 1+1e-5), c, ErrNormBound},
		{"max float32 no overflow, accepted", 1, []float32{math.MaxFloat32, math.MaxFloat32, 0}, 1e39, nil},
		{"max float32 no overflow, rejected", math.MaxInt64, []float32{math.MaxFloat32, -math.MaxFloat32, math.MaxFloat32}, 1, ErrNormBound},
		{"subnormals", 1, []float32{math.SmallestNonzeroFloat32, 0, 0}, 1e-44, nil},
	}
	for _, tc := range cases {
		r, err := NewRound(1, []string{"a"}, 3, tc.clip, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Add(Contribution{NodeID: "a", Step: 1, Count: tc.count, Sum: tc.sum}); !errors.Is(err, tc.want) {
			t.Errorf("%s: Add error %v, want %v", tc.name, err, tc.want)
		}
		r.Close()
	}
}

// randomContributions returns n contributions of dimension d whose values
// span many orders of magnitude, so float addition order matters.
func randomContributions(seed uint64, n, d int) []Contribution {
	rng := rand.New(rand.NewPCG(seed, 1))
	cs := make([]Contribution, n)
	for i := range cs {
		s := make([]float32, d)
		for j := range s {
			s[j] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(14)-7)))
		}
		cs[i] = Contribution{NodeID: fmt.Sprintf("node-%02d", i), Step: 1, Count: 1 << 40, Sum: s}
	}
	return cs
}

func nodeIDs(cs []Contribution) []string {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.NodeID
	}
	return ids
}

func TestArrivalOrderIndependence(t *testing.T) {
	const n, d = 12, 2000
	cs := randomContributions(3, n, d)
	rng := rand.New(rand.NewPCG(4, 4))
	var first []float64
	naiveDiffers := false
	var firstNaive []float64
	for trial := range 30 {
		order := rng.Perm(n)
		r, err := NewRound(1, nodeIDs(cs), d, 1, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		naive := make([]float64, d)
		if trial%2 == 0 {
			for _, i := range order {
				mustAdd(t, r, cs[i])
				for j, v := range cs[i].Sum {
					naive[j] += float64(v)
				}
			}
		} else { // concurrently
			var wg sync.WaitGroup
			for _, i := range order {
				wg.Go(func() {
					if err := r.Add(cs[i]); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
		}
		res, err := r.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first, firstNaive = res.Sum, naive
			continue
		}
		for j := range first {
			if math.Float64bits(res.Sum[j]) != math.Float64bits(first[j]) {
				t.Fatalf("trial %d: Sum[%d] = %x, first trial %x", trial, j, math.Float64bits(res.Sum[j]), math.Float64bits(first[j]))
			}
		}
		if trial%2 == 0 && !slices.Equal(naive, firstNaive) {
			naiveDiffers = true
		}
	}
	// The data must be such that arrival-order summation would differ;
	// otherwise this test could not fail.
	if !naiveDiffers {
		t.Fatal("arrival-order sums never differed: test data too benign")
	}
}

// Concurrent Adds, including duplicates and bad ones, under -race.
func TestConcurrentAdds(t *testing.T) {
	cs := randomContributions(5, 16, 64)
	r, err := NewRound(1, nodeIDs(cs), 64, 1, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := 0
	for rep := range 3 {
		for _, c := range cs {
			wg.Go(func() {
				if rep == 2 {
					c.Step = 9
				}
				if r.Add(c) == nil {
					mu.Lock()
					accepted++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	res := r.Close()
	if accepted != len(cs) || len(res.Accepted) != len(cs) {
		t.Errorf("accepted %d (%d in result), want %d", accepted, len(res.Accepted), len(cs))
	}
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Reasons() {
		name := r.String()
		if seen[name] || r.Err() == nil {
			t.Errorf("reason %d: name %q duplicate or no error", r, name)
		}
		seen[name] = true
	}
	if len(seen) != 11 {
		t.Errorf("%d reasons, want 11", len(seen))
	}
	if Reason(0).Err() != nil || Reason(200).Err() != nil {
		t.Error("unknown reasons have errors")
	}
}

package node

import (
	"context"
	"errors"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/transport"
)

// TestViewAnswersLikeCopiedShard: a Worker on a view of the shared
// dataset (coordinator local's nodes) reports its shard's size and answers
// with the same contribution, bit for bit, as a Worker on a copy of the
// same rows: the same positions sampled, mapped to the same examples.
func TestViewAnswersLikeCopiedShard(t *testing.T) {
	const seed = 31
	fx := logregFixture(t)
	views, err := dataset.ShardViewsIID(fx.shard, 3, 7)
	if err != nil {
		t.Fatal(err)
	}
	view := views[1]
	copied := fixture{m: fx.m, shard: fx.shard.Subset(view.Rows), theta: fx.theta}

	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.ShardIndex, cfg.ShardCount, cfg.ShardSeed = 1, 3, 7
	cfg.MaxBatch = 16
	cfg.SeededSampling, cfg.SamplingSeed = true, seed
	w, err := NewWorkerView(cfg, fx.m, view, nc, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("Run: %v", err)
		}
	})

	j := recv(t, l.joins, "join")
	if j.ShardSize != int64(view.Len()) || j.ShardSize == int64(fx.shard.Len()) {
		t.Fatalf("join reports %d examples, want the view's %d (of %d)", j.ShardSize, view.Len(), fx.shard.Len())
	}
	l.announce("r1", 1)
	for step := uint64(1); step <= 3; step++ {
		l.params(step-1, 1, fx.theta) // θ unchanged, a new version each step
		rs := fx.round(step, 100+step, 1, wait)
		l.publish(rs)
		c := recv(t, l.contribs, "contribution")
		want, wantN := reference(t, copied, rs, seed, cfg.MaxBatch)
		if int(c.Count) != wantN {
			t.Fatalf("step %d: count %d, the copied shard's %d", step, c.Count, wantN)
		}
		for i := range want {
			if c.Sum[i] != want[i] {
				t.Fatalf("step %d: sum[%d] = %v, the copied shard's %v", step, i, c.Sum[i], want[i])
			}
		}
	}
}

func TestNewWorkerViewErrors(t *testing.T) {
	fx := logregFixture(t)
	_, nc, _ := fakePair(t)
	for _, tc := range []struct {
		name string
		view dataset.View
		conn transport.Conn
	}{
		{"no dataset", dataset.View{Name: "x"}, nc},
		{"row out of range", dataset.View{Name: "x", Data: fx.shard, Rows: []int{0, fx.shard.Len()}}, nc},
		{"rows repeated", dataset.View{Name: "x", Data: fx.shard, Rows: []int{3, 3}}, nc},
		{"empty rows", dataset.View{Name: "x", Data: fx.shard, Rows: []int{}}, nc},
		{"nil conn", dataset.All(fx.shard), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewWorkerView(testConfig(), fx.m, tc.view, tc.conn, nil); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("NewWorkerView = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

package coordinatortest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/coordinator"
)

// The crash points of the leader's commit path (coordinator.CrashPoints).
const (
	CrashBeforeCharge    = coordinator.CrashBeforeCharge
	CrashChargeCommitted = coordinator.CrashChargeCommitted
	CrashBeforeGrad      = coordinator.CrashBeforeGrad
	CrashGradQueued      = coordinator.CrashGradQueued
	CrashGradApplied     = coordinator.CrashGradApplied
)

// CrashPoints lists the crash points in commit-path order.
var CrashPoints = coordinator.CrashPoints

// CrashAt kills the leader when it reaches Point for Step (once, in the
// run): the replica is cut from every other replica and node at once (the
// observer still sees what it had sent), its operation never returns, and
// its Server and Raft are stopped (Crash).
type CrashAt struct {
	Point string
	Step  int64
}

// crashHooks is a Consensus over a replica that calls the cluster's crash
// point at each link of the commit path.
type crashHooks struct {
	*coordinator.Replica
	c  *Cluster
	id string
}

// at kills this replica if the cluster's CrashAt names point and step
// (the first time only): it cuts the replica off, starts Crash and blocks
// until ctx ends (Crash cancels the Server, which cancels ctx). It
// returns ctx's error then, nil when nothing is killed.
func (h *crashHooks) at(ctx context.Context, point string, step int64) error {
	ca := h.c.opts.CrashAt
	if ca == nil || ca.Point != point || ca.Step != step || !h.c.crashOnce.CompareAndSwap(false, true) {
		return nil
	}
	h.c.cutOff(h.id)
	killed := h.c.member(h.id).killed
	go h.c.Crash(h.id)
	// The operation never returns a result, as in a crash; it ends when
	// Crash stops the replica (a grad proposal's ctx is not cancelled
	// with the Server: it waits for killed).
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-killed:
		return errCrashed
	}
}

// errCrashed ends an operation of a replica Crash killed.
var errCrashed = errors.New("coordinatortest: the replica crashed")

// member returns replica id's member.
func (c *Cluster) member(id string) *member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replicas[id]
}

func (h *crashHooks) ProposeCharge(ctx context.Context, step int64, e accounting.Event, round string) (coordinator.ApplyResult, error) {
	if err := h.at(ctx, CrashBeforeCharge, step); err != nil {
		return coordinator.ApplyResult{}, err
	}
	res, err := h.Replica.ProposeCharge(ctx, step, e, round)
	if err == nil {
		if err := h.at(ctx, CrashChargeCommitted, step); err != nil {
			return coordinator.ApplyResult{}, err
		}
	}
	return res, err
}

func (h *crashHooks) ProposeGrad(ctx context.Context, step int64, charge uint64, g []float32) (func() (coordinator.ApplyResult, error), error) {
	if err := h.at(ctx, CrashBeforeGrad, step); err != nil {
		return nil, err
	}
	wait, err := h.Replica.ProposeGrad(ctx, step, charge, g)
	if err != nil {
		return nil, err
	}
	return func() (coordinator.ApplyResult, error) {
		if err := h.at(ctx, CrashGradQueued, step); err != nil {
			return coordinator.ApplyResult{}, err
		}
		res, err := wait()
		if err == nil {
			if err := h.at(ctx, CrashGradApplied, step); err != nil {
				return coordinator.ApplyResult{}, err
			}
		}
		return res, err
	}, nil
}

// cutOff cuts id from every replica and node, on top of the current
// partition.
func (c *Cluster) cutOff(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range append(slices.Clone(c.order), c.nodeIDs...) {
		c.cutLocked(id, o)
	}
}

// Crash kills replica id as a crash of its process would: it is cut from
// every other replica and node, its Server stopped and its Raft shut down
// (without a leadership transfer: it is cut off). Its data dir stays, for
// CheckDisks; it is no longer live, and Heal leaves it cut. Crashed
// returns the IDs crashed so far.
func (c *Cluster) Crash(id string) {
	c.cutOff(id)
	c.mu.Lock()
	m := c.replicas[id]
	if m == nil || m.removed {
		c.mu.Unlock()
		return
	}
	m.removed, m.crashed = true, true
	c.mu.Unlock()
	close(m.killed)
	m.stop()
	<-m.done
	if err := m.replica.Close(); err != nil {
		c.log.Info("crashed replica closed", "replica", id, "err", err)
	}
	m.conn.Close()
	close(m.closed)
}

// Crashed returns the IDs of the replicas Crash killed, once each is
// closed, waiting for them (at most until ctx ends).
func (c *Cluster) Crashed(ctx context.Context) []string {
	c.mu.Lock()
	var ms []*member
	for _, id := range c.order {
		if m := c.replicas[id]; m.crashed {
			ms = append(ms, m)
		}
	}
	c.mu.Unlock()
	var ids []string
	for _, m := range ms {
		select {
		case <-m.closed:
			ids = append(ids, m.id)
		case <-ctx.Done():
		}
	}
	return ids
}

// CheckDisks asserts that no g̃ reached a disk uncharged: every noisy
// gradient in any replica's Raft log, crashed replicas included
// (coordinator.LoggedReleases), has its charge — a charge record at its
// charge's Raft index — in every live replica's ledger. Call it after
// Wait.
func (c *Cluster) CheckDisks(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	var all []*member
	for _, id := range c.order {
		all = append(all, c.replicas[id])
	}
	c.mu.Unlock()
	charged := make(map[string]map[uint64]int64) // live replica → charge index → step
	for _, m := range all {
		if m.removed {
			continue
		}
		charged[m.id] = make(map[uint64]int64)
		for _, r := range chargeRecords(t, m) {
			charged[m.id][r.Index] = r.Step
		}
	}
	releases := 0
	for _, m := range all {
		rel, err := coordinator.LoggedReleases(m.dir)
		if err != nil {
			t.Errorf("replica %s: reading its Raft log: %v", m.id, err)
			continue
		}
		releases += len(rel)
		for _, r := range rel {
			for id, byIndex := range charged {
				if step, ok := byIndex[r.Charge]; !ok || step != r.Step {
					t.Errorf("g̃ of step %d (Raft index %d, term %d) on %s's disk: no charge at index %d in %s's ledger",
						r.Step, r.Index, r.Term, m.id, r.Charge, id)
				}
			}
		}
	}
	if releases == 0 {
		t.Error("no g̃ on any disk: nothing was checked")
	}
}

// errNoCrash says a crash point was never reached.
var errNoCrash = errors.New("coordinatortest: the crash point was never reached")

// WaitCrash waits until the crash CrashAt asked for has happened and the
// replica is closed, and returns its ID.
func (c *Cluster) WaitCrash(ctx context.Context) (string, error) {
	for {
		if ids := c.Crashed(ctx); len(ids) > 0 {
			return ids[0], nil
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return "", fmt.Errorf("%w (%v at step %d): %w", errNoCrash, c.opts.CrashAt.Point, c.opts.CrashAt.Step, err)
		}
	}
}

var _ coordinator.Consensus = (*crashHooks)(nil)

// Charges returns the Raft terms of the charge records each live
// replica's ledger holds for step, in ledger order.
func (c *Cluster) Charges(t testing.TB, step int64) map[string][]uint64 {
	t.Helper()
	out := make(map[string][]uint64)
	for _, m := range c.live() {
		for _, r := range chargeRecords(t, m) {
			if r.Step == step {
				out[m.id] = append(out[m.id], r.Term)
			}
		}
	}
	return out
}

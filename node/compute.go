package node

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
	"github.com/dpcluster/dpcluster/transport"
)

// answer samples the shard, computes the clipped sum at theta and publishes
// the contribution, unless the deadline passes first. The sum and count
// are private: they appear in no log, metric or error. No record changes
// whether the round is answered: ClippedSum zeroes an example whose
// gradient is not finite instead of failing.
func (s *runLoop) answer(ctx context.Context, rs transport.RoundStart, deadline time.Time, theta transport.Vector) {
	w := s.w
	start := time.Now()
	count, err := w.compute(rs, theta)
	defer clear(w.sum) // private: keep it no longer than needed
	w.met.computed(time.Since(start).Seconds())
	if err != nil {
		s.skip(rs, SkipCompute, computeErrorClass(err))
		return
	}
	if !time.Now().Before(deadline) {
		s.skip(rs, SkipDeadline, "computation finished after the deadline")
		return
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err = w.conn.Publish(pctx, transport.Contribution{Run: w.cfg.Run, Step: rs.Step, RoundID: rs.RoundID,
		NodeID: w.cfg.ID, Count: int64(count), Sum: w.sum})
	if err != nil {
		if s.fatalPublish(ctx, err) || ctx.Err() != nil {
			return
		}
		s.skip(rs, SkipPublish, err.Error())
		return
	}
	w.lastStep.Store(rs.Step)
	w.update(func(st *Stats) { st.Answered++; st.LastStep = rs.Step })
	w.met.answered(rs.Step)
	w.log.Debug("node: contribution sent", "step", rs.Step, "round", rs.RoundID,
		"compute", time.Since(start).Round(time.Microsecond))
}

// compute fills w.sum with the clipped gradient sum of a fresh Poisson
// sample and returns its size.
func (w *Worker) compute(rs transport.RoundStart, theta transport.Vector) (int, error) {
	// The run's own q and C (Config), never the round's: checkRun has
	// refused any round that names others, and reading them here as well
	// keeps the mechanism the ledger charges in one place on this side.
	q, clip := w.cfg.SampleRate, w.cfg.ClipNorm
	var (
		p   *sampling.Poisson
		err error
	)
	if w.cfg.SeededSampling {
		p, err = sampling.NewSeededPoisson(q, w.cfg.SamplingSeed+rs.Step)
	} else {
		p, err = sampling.NewPoisson(q)
	}
	if err != nil {
		return 0, err
	}
	// Positions in the shard, then rows of the shared dataset. An audit's
	// canary positions are n, n+1, ... after the shard's n examples,
	// sampled by the same draw (Canaries); those past its canaries are
	// empty.
	n := w.shard.Len()
	var canaries []int
	if w.canaries != nil {
		all := p.Sample(w.batch[:0], n+w.canaries.positions)
		k, _ := slices.BinarySearch(all, n) // Sample's positions increase
		e, _ := slices.BinarySearch(all, n+len(w.canaries.idx))
		all, canaries = all[:k], all[k:e]
		w.batch = all
	} else {
		w.batch = p.Sample(w.batch[:0], n)
	}
	w.batch = w.shard.Map(w.batch)
	count, err := w.eng.ClippedSumIndexed(w.sum, theta, w.shard.Data, w.batch, clip)
	if err != nil || len(canaries) == 0 {
		return count, err
	}
	for _, pos := range canaries {
		w.canaries.add(w.sum, pos-n, clip)
	}
	return count + len(canaries), nil
}

// computeErrorClass names a compute error without its text, which could
// mention which examples were sampled (private).
func computeErrorClass(err error) string {
	switch {
	case errors.Is(err, model.ErrNonFinite):
		return "non-finite gradient"
	case errors.Is(err, model.ErrBadClip):
		return "bad clip norm"
	case errors.Is(err, model.ErrShape):
		return "shape mismatch"
	case errors.Is(err, sampling.ErrInvalidQ):
		return "bad sampling rate"
	}
	return "internal error"
}

package node

import (
	"context"
	"math"
	"time"

	"github.com/dpcluster/dpcluster/transport"
)

// maxParamsKept bounds the parameter versions held (the highest ones):
// the version of the round being answered and the next one, which the
// leader publishes before it opens that round. An older version a late
// round still names is asked for again (NeedParams). Each version is a
// model-sized vector (80 MB at 20M parameters), held for the whole run.
const maxParamsKept = 2

func (s *runLoop) askParams(ctx context.Context) {
	w, p := s.w, s.pending
	p.nextAsk = time.Now().Add(w.cfg.ParamsRetry)
	err := w.conn.Publish(ctx, transport.NeedParams{Run: w.cfg.Run, NodeID: w.cfg.ID, Version: p.rs.ParamsVersion})
	if err != nil {
		if !s.fatalPublish(ctx, err) {
			w.log.Warn("node: params request not sent", "version", p.rs.ParamsVersion, "err", err)
		}
		return
	}
	w.update(func(st *Stats) { st.NeedParamsSent++ })
	w.log.Debug("node: asked for params", "version", p.rs.ParamsVersion, "step", p.rs.Step)
}

// store keeps a validated parameter version published in term, evicting
// the lowest beyond maxParamsKept. A version below every held one is kept
// only if needed (a round waits for it: it evicts the lowest held one);
// otherwise it is dropped. It reports whether v is new: a version not
// held, or held from an older term (replaced).
func (s *runLoop) store(version, term uint64, v transport.Vector, needed bool) bool {
	if old, ok := s.params[version]; ok {
		if s.paramsTerm[version] >= term {
			return false
		}
		s.params[version] = append(old[:0], v...)
		s.paramsTerm[version] = term
		return true
	}
	// A copy in a buffer of our own: the decoded values may sit at any
	// 4-byte offset of a message buffer, and the BLAS kernels' summation
	// order depends on alignment, so computing on the copy makes the sum
	// reproducible bit for bit; and on a GPU the buffer is the engine's
	// page-locked memory (Worker.vector), which the device reads with no
	// staging copy. The buffer is the evicted version's, if one is evicted
	// (the loop owns them all; none is in use between messages): no
	// model-sized allocation per step.
	var buf transport.Vector
	if len(s.params) >= maxParamsKept {
		lowest := uint64(math.MaxUint64)
		for k := range s.params {
			lowest = min(lowest, k)
		}
		if version > lowest || needed { // else v itself is the one evicted
			buf = s.params[lowest]
			delete(s.params, lowest)
			delete(s.paramsTerm, lowest)
			s.params[version] = append(buf[:0], v...)
			s.paramsTerm[version] = term
		}
	} else {
		s.params[version] = append(s.w.vector()[:0], v...)
		s.paramsTerm[version] = term
	}
	w := s.w
	var highest uint64
	w.update(func(st *Stats) {
		st.ParamsReceived++
		st.ParamsVersion = max(st.ParamsVersion, version)
		highest = st.ParamsVersion
	})
	w.met.params(highest)
	return true
}

func (s *runLoop) onParams(ctx context.Context, p transport.Params) {
	w := s.w
	if p.Term < s.term {
		w.update(func(st *Stats) { st.ParamsRejected++ })
		w.log.Debug("node: ignoring params of an older term", "version", p.Version, "term", p.Term, "current_term", s.term)
		return
	}
	if err := checkParams(p.Values, w.m.NumParams()); err != nil {
		w.update(func(st *Stats) { st.ParamsRejected++ })
		w.log.Warn("node: invalid params dropped", "version", p.Version, "term", p.Term, "reason", err.Error())
		return
	}
	pr := s.pending
	waited := pr != nil && pr.rs.ParamsVersion == p.Version && pr.rs.Term == p.Term
	if !s.store(p.Version, p.Term, p.Values, waited) {
		return
	}
	w.log.Debug("node: params received", "version", p.Version, "term", p.Term)
	if waited {
		s.pending = nil
		s.answer(ctx, pr.rs, pr.deadline, s.params[p.Version])
	}
}

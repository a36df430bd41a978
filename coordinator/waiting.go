package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The leader waiting for nodes before a round can open: what it has,
// what it needs, which named nodes are missing, said in its log and its
// status reports.

// waitLogEvery is how often the leader repeats, while it waits for
// nodes, which it has and which it waits for.
const waitLogEvery = 5 * time.Second

// nodeWait is the leader waiting for nodes: fewer live nodes it may
// include in a round than ServerConfig.MinNodes.
type nodeWait struct {
	have    []string // the live nodes a round would include, sorted
	need    int      // MinNodes
	missing []string // the run's named nodes (RunConfig.Nodes) not in have
}

// newNodeWait is the wait for nodes with the live nodes a round would
// include, or nil if they are enough.
func newNodeWait(nodes []string, need int, named []string) *nodeWait {
	if len(nodes) >= need {
		return nil
	}
	w := &nodeWait{have: slices.Sorted(slices.Values(nodes)), need: need}
	for _, id := range named {
		if !slices.Contains(nodes, id) {
			w.missing = append(w.missing, id)
		}
	}
	return w
}

// String is the wait as the replica reports it ("" for nil): "waiting
// for nodes: 1 of 2, missing b".
func (w *nodeWait) String() string {
	if w == nil {
		return ""
	}
	msg := fmt.Sprintf("waiting for nodes: %d of %d", len(w.have), w.need)
	if len(w.missing) > 0 {
		msg += ", missing " + strings.Join(w.missing, " ")
	}
	return msg
}

// setWaiting records whether the leader waits for nodes (nil: it has
// enough) for the status reports, and logs a change at once and an
// unchanged wait every waitLogEvery: the loop retries every 50 ms.
func (l *loop) setWaiting(w *nodeWait) {
	was := l.waiting
	l.waiting = w
	if w == nil {
		if was != nil {
			l.statusDirty = true
			l.log.Info("enough nodes for a round", "nodes", was.need)
		}
		return
	}
	now := time.Now()
	if was != nil && w.String() == was.String() && now.Sub(l.waitLoggedAt) < waitLogEvery {
		return
	}
	l.statusDirty, l.waitLoggedAt = true, now
	args := []any{"have", strings.Join(w.have, ","), "live", len(w.have), "need", w.need}
	if w.missing != nil {
		args = append(args, "missing", strings.Join(w.missing, ","))
	}
	l.log.Info("waiting for nodes before the next round", args...)
}

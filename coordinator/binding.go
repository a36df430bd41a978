package coordinator

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/transport"
)

// Data bindings: the run binds each node ID to the content hash of the
// examples it trains on (transport.Join.DataHash) the first time the
// leader admits it (loop.bindData proposes a bindEntry), and refuses the
// ID with other data from then on (checkBinding), on every replica and
// after restarts, since the bindings are in the log and the snapshots.

// applyBind records a node's data binding (bindEntry) unless the node ID
// is bound already: the first binding stands, so a later entry for the
// ID (two leaders racing, or a node that changed its data between the
// proposal and the commit) changes nothing, and the leader refuses the
// ID's other data from then on. An entry that names no node or no valid
// hash is refused (an honest leader proposes none) without failing the
// replica: it binds nothing. Called with f.mu held.
func (f *FSM) applyBind(body []byte) ApplyResult {
	var b bindEntry
	if err := msgpack.Unmarshal(body, &b); err != nil {
		return f.fail(fmt.Errorf("%w: bind: %v", ErrBadEntry, err))
	}
	if b.Node == "" || len(b.Node) > maxNodeID || b.Data == "" || !transport.ValidWeights(b.Data) {
		return ApplyResult{Step: f.applied, Err: fmt.Errorf("%w: data binding of node %q to %q", ErrBadEntry, b.Node, b.Data)}
	}
	if _, ok := f.bindings[b.Node]; !ok {
		if f.bindings == nil {
			f.bindings = make(map[string]string)
		}
		f.bindings[b.Node] = b.Data
		f.log.Info("node bound to its training data", "node", b.Node, "data_hash", b.Data)
	}
	return ApplyResult{Step: f.applied, Epsilon: f.ledger.Spent()}
}

// DataBinding returns the content hash of the training data node ID id
// is bound to (bindEntry) and whether it is bound.
func (f *FSM) DataBinding(id string) (string, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	h, ok := f.bindings[id]
	return h, ok
}

// checkBinding returns rejectDataHash if node n reports other training
// data than bound, the content hash its ID was first admitted with
// (bindEntry; isBound false: none), else "". A node reporting no hash (one that predates
// the field) is bound to nothing and refused once its ID is bound; a hash
// that is not 64 lowercase hex digits is never one a binding holds, so it
// is refused too.
func checkBinding(bound string, isBound bool, n nodeReport) string {
	if isBound && n.dataHash != bound || !transport.ValidWeights(n.dataHash) {
		return rejectDataHash
	}
	return ""
}

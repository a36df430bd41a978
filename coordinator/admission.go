package coordinator

import (
	"fmt"
	"maps"
	"slices"

	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// Admission: which nodes may take part in a round. Two rules, each in one
// function:
//
//   - admitNode, per node, when its Join or Heartbeat arrives: the node
//     runs the run's model, says which shard it holds, and does not sample
//     from a seed in a private run. A refused node is not registered (so
//     it is never a round member) and is told why.
//   - checkShards, per round, over the live registered nodes the leader
//     is about to make the round's members: their shards are disjoint
//     parts of the training set, and hold at most N examples together.
//     If not, the leader opens no round.
//
// In a run whose nodes bring their own data (RunConfig.DataSchema), a
// node claims no shard: it reports its data's schema, which must be the
// run's, and its example count. Disjointness across sites cannot be
// checked without revealing the data; the privacy unit stays one example,
// and one person's records held at two sites are two examples
// (docs/PRIVACY.md, "Node-local data").
//
// Both guard the premise of the privacy charge. The ledger charges every
// step as the Poisson-subsampled Gaussian mechanism with the run's q and σ
// (dp-adambc.tex, Algorithm 1: "Take a random batch with sampling
// probability B/N"; Appendix E: q = L/N, after Abadi et al. 2016,
// Algorithm 1), which holds when each training example is in the batch
// independently with probability q, at most once, and the batch is
// secret. An example held by k live nodes is in the batch with probability
// 1−(1−q)^k and contributes up to k·C to the sum; an example held by a node
// that samples from a known seed is in a batch anyone can predict, so
// amplification by subsampling does not apply.

// Status.Detail values with which a replica refuses a node's Join or
// Heartbeat (node.RejectModelHash and friends are the same strings).
const (
	rejectModelHash     = "model_hash"
	rejectShardIdentity = "shard_identity"
	rejectSeedPolicy    = "seed_policy"
	rejectDataSchema    = "data_schema"
)

// nodeReport is what a node says about itself in Join and Heartbeat: all
// public configuration.
type nodeReport struct {
	id, modelHash string
	seedPolicy    seed.Policy
	shard         shardClaim
	dataSchema    string // node-local data: its schema; "" for a shard
}

// shardClaim is the shard a node says it holds: part index of count IID
// parts of the run's training set cut with seed, size examples. A node
// with its own data claims count 0 (and index and seed 0): its own size
// examples.
type shardClaim struct {
	index, count int
	seed         uint64
	size         int64
}

func reportOf(m transport.Message) (nodeReport, bool) {
	switch v := m.(type) {
	case transport.Join:
		return nodeReport{id: v.NodeID, modelHash: v.ModelHash, seedPolicy: v.SeedPolicy, dataSchema: v.DataSchema,
			shard: shardClaim{index: v.ShardIndex, count: v.ShardCount, seed: v.ShardSeed, size: v.ShardSize}}, true
	case transport.Heartbeat:
		return nodeReport{id: v.NodeID, modelHash: v.ModelHash, seedPolicy: v.SeedPolicy, dataSchema: v.DataSchema,
			shard: shardClaim{index: v.ShardIndex, count: v.ShardCount, seed: v.ShardSeed, size: v.ShardSize}}, true
	}
	return nodeReport{}, false
}

// admitNode returns why run refuses the node n (a reject* reason), or "".
// It is the only check of a node's data schema, model, shard identity and
// seed policy:
//
//   - in a run whose nodes bring their own data (run.DataSchema set), its
//     data schema must be the run's, and it must claim no shard (count,
//     index and seed 0). The schema is checked first, so that a node
//     whose data has another shape or label set hears that, not only
//     that its model (shaped by the data) differs;
//   - its model hash must be the run's;
//   - otherwise it must name its shard (count ≥ 1, 0 ≤ index < count,
//     size ≥ 0) and no data schema, and its seed policy: a node that does
//     not (an older node) cannot be checked for overlap, so it is refused;
//   - in a private run (SeedPolicy seed.Crypto) it must sample from the
//     CSPRNG (seed.Crypto). In a seeded run any node may
//     take part: the run is already recorded as not private (the ledger's
//     run record names the seeded noise, and its audit says not private).
func admitNode(run RunConfig, n nodeReport) string {
	c := n.shard
	local := run.DataSchema != ""
	switch {
	case local && n.dataSchema != run.DataSchema:
		return rejectDataSchema
	case n.modelHash != run.ModelHash:
		return rejectModelHash
	case local && (c.count != 0 || c.index != 0 || c.seed != 0 || c.size < 0),
		!local && (n.dataSchema != "" || c.count < 1 || c.index < 0 || c.index >= c.count || c.size < 0),
		n.seedPolicy.Validate() != nil:
		return rejectShardIdentity
	case run.SeedPolicy != seed.Seeded && n.seedPolicy != seed.Crypto:
		return rejectSeedPolicy
	}
	return ""
}

// Reasons the leader opens no round over the live nodes: the label values
// of dpcluster_coordinator_rounds_blocked.
const (
	// blockShardSplit: the live nodes cut the training set differently
	// (different shard counts or seeds), so their shards may overlap.
	blockShardSplit = "shard_split"
	// blockShardOverlap: two live nodes claim the same shard.
	blockShardOverlap = "shard_overlap"
	// blockShardSizes: the live nodes' shards hold more than N examples.
	blockShardSizes = "shard_sizes"
)

var blockReasons = []string{blockShardSplit, blockShardOverlap, blockShardSizes}

// roundBlock says why the leader opens no round: a block reason and a
// public detail (node IDs, shard numbers, sizes).
type roundBlock struct {
	reason, detail string
}

func (b *roundBlock) String() string {
	if b == nil {
		return ""
	}
	return b.reason + ": " + b.detail
}

// checkShards returns nil if the shards claimed by the live nodes are
// disjoint parts of a training set of n examples, else why not. It is the
// only check of that rule. The shards are disjoint when every node cut the
// same set the same way — the same count and seed (dataset.ShardIID is a
// partition for a given count and seed) — and no two nodes claim the same
// index; and since the nodes report their sizes, those must add up to at
// most n. Nodes with their own data (count 0, admitted only to a run of
// such nodes) cut nothing: only their sizes are checked. Integer arithmetic: exact, and the sum stops at the first size
// that would take it past n (no overflow). The nodes are visited in ID
// order, so the detail is deterministic.
func checkShards(claims map[string]shardClaim, n int64) *roundBlock {
	ids := slices.Sorted(maps.Keys(claims))
	if len(ids) == 0 {
		return nil
	}
	first := claims[ids[0]]
	holder := make(map[int]string, len(ids))
	var total int64
	for _, id := range ids {
		c := claims[id]
		if c.count != first.count || c.seed != first.seed {
			return &roundBlock{blockShardSplit, fmt.Sprintf("node %s cuts the training set into %d shards with seed %d, node %s into %d with seed %d",
				ids[0], first.count, first.seed, id, c.count, c.seed)}
		}
		if other, dup := holder[c.index]; dup && c.count != 0 {
			return &roundBlock{blockShardOverlap, fmt.Sprintf("nodes %s and %s both hold shard %d of %d", other, id, c.index, c.count)}
		}
		holder[c.index] = id
		if c.size > n-total {
			return &roundBlock{blockShardSizes, fmt.Sprintf("the live nodes' shards hold more than N = %d examples (node %s: %d, the nodes before it: %d)",
				n, id, c.size, total)}
		}
		total += c.size
	}
	return nil
}

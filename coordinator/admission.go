package coordinator

import (
	"fmt"
	"slices"

	"github.com/dpcluster/dpcluster/aggregation"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// Admission: which nodes may take part in a round. Three rules, each in
// one function:
//
//   - registry.holder, per node ID, when a Join or Heartbeat arrives: an
//     ID has one seat, held by one process (its incarnation). Another incarnation
//     presenting the ID while the holder is live (heard from within the
//     node timeout) is refused and told why; its messages change nothing
//     about the holder's registration. The seat is free again once the
//     holder lapses or leaves.
//   - admitNode, per node, when its Join or Heartbeat arrives: the node
//     runs the run's model from the run's pretrained weights (if any),
//     says which shard it holds, and does not sample from a seed in a
//     private run. A refused node is not registered (so it is never a
//     round member) and is told why.
//   - checkShards, per round, over the live registered nodes: the
//     round's members are those whose shards are disjoint parts of the
//     training set holding at most N examples together; a node whose
//     claim conflicts with an older claim is left out of the round (and
//     the leader says why), so that no node can stall the others by
//     claiming their shard.
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
	rejectWeights       = "pretrained_weights"
	// rejectDataHash: the node ID is bound to other training data (the
	// content hash of its first admission, bindEntry) than it reports.
	rejectDataHash = "training_data"
	// rejectSeatTaken: another process (incarnation) holds the node ID's
	// seat and is live (registry.holder).
	rejectSeatTaken = "seat_taken"
)

// refusalReasons are the reject* reasons, the label values of
// dpcluster_coordinator_node_messages_refused_total.
var refusalReasons = []string{rejectModelHash, rejectShardIdentity, rejectSeedPolicy, rejectDataSchema, rejectWeights, rejectDataHash, rejectSeatTaken}

// nodeReport is what a node says about itself in Join and Heartbeat: all
// public configuration.
type nodeReport struct {
	id, modelHash string
	seedPolicy    seed.Policy
	shard         shardClaim
	dataSchema    string // node-local data: its schema; "" for a shard
	weights       string // the pretrained weights' hex SHA-256; "" for none
	dataHash      string // its training data's content hash (transport.Join.DataHash); "" for none
	incarnation   string // the node process's incarnation (transport.Join.Incarnation)
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
		return nodeReport{id: v.NodeID, modelHash: v.ModelHash, seedPolicy: v.SeedPolicy, dataSchema: v.DataSchema, weights: v.Weights,
			dataHash: v.DataHash, incarnation: v.Incarnation, shard: shardClaim{index: v.ShardIndex, count: v.ShardCount, seed: v.ShardSeed, size: v.ShardSize}}, true
	case transport.Heartbeat:
		return nodeReport{id: v.NodeID, modelHash: v.ModelHash, seedPolicy: v.SeedPolicy, dataSchema: v.DataSchema, weights: v.Weights,
			dataHash: v.DataHash, incarnation: v.Incarnation, shard: shardClaim{index: v.ShardIndex, count: v.ShardCount, seed: v.ShardSeed, size: v.ShardSize}}, true
	}
	return nodeReport{}, false
}

// admitNode returns why run refuses the node n (a reject* reason), or "".
// It is the only check of a node's data schema, model, pretrained weights,
// shard identity and seed policy:
//
//   - if the run names its nodes (run.Nodes), the node's ID must be one of
//     them, and (unless the nodes bring their own data) it must claim the
//     shard the list gives it: index i of len(run.Nodes) for Nodes[i];
//   - in a run whose nodes bring their own data (run.DataSchema set), its
//     data schema must be the run's, and it must claim no shard (count,
//     index and seed 0). The schema is checked first, so that a node
//     whose data has another shape or label set hears that, not only
//     that its model (shaped by the data) differs;
//   - its model hash must be the run's;
//   - its pretrained weights hash must be the run's (run.Pretrained's
//     WeightsSHA256), and a node of a run with no checkpoint must report
//     none: the weights are public inputs every participant must share,
//     and two checkpoints of one architecture have the same model hash.
//     It is checked after the model, so that a node with another model
//     hears that first;
//   - otherwise it must name its shard (count ≥ 1, 0 ≤ index < count)
//     with that shard's size (exact: dataset.ShardIndicesIID's, for the
//     run's N; a node cannot claim more examples than its shard holds) and
//     no data schema, and its seed policy: a node that does not (an older
//     node) cannot be checked for overlap, so it is refused;
//   - in a private run (SeedPolicy seed.Crypto) it must sample from the
//     CSPRNG (seed.Crypto). In a seeded run any node may
//     take part: the run is already recorded as not private (the ledger's
//     run record names the seeded noise, and its audit says not private).
func admitNode(run RunConfig, n nodeReport) string {
	c := n.shard
	local := run.DataSchema != ""
	if len(run.Nodes) > 0 {
		// The run file binds IDs to shards: node Nodes[i] holds shard i
		// of len(Nodes), and no other ID is admitted.
		i := slices.Index(run.Nodes, n.id)
		if i < 0 || !local && (c.index != i || c.count != len(run.Nodes)) {
			return rejectShardIdentity
		}
	}
	switch {
	case local && n.dataSchema != run.DataSchema:
		return rejectDataSchema
	case n.modelHash != run.ModelHash:
		return rejectModelHash
	case n.weights != run.pretrainedWeights():
		return rejectWeights
	case local && (c.count != 0 || c.index != 0 || c.seed != 0 || c.size < 0),
		!local && (n.dataSchema != "" || c.count < 1 || c.index < 0 || c.index >= c.count),
		!local && c.size != iidShardSize(run.TotalExamples, c.index, c.count),
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

// checkShards returns the live nodes that may be a round's members — in
// order, each whose claim is consistent with the claims admitted before
// it — and, if it left any out, why (the first it left out). It is the
// only check of the rule that a round's members hold disjoint parts of a
// training set of n examples. order lists the live nodes oldest claim
// first (registry.live), so a claim that conflicts with an older one is
// the one left out: no message from one node can take another's place in
// the rounds (issue 27). Shards are disjoint when every member cut the
// same set the same way — the same count and seed (dataset.ShardIID is a
// partition for a given count and seed) — and no two claim the same
// index; and the members' sizes add up to at most n. Nodes with their own
// data (count 0, admitted only to a run of such nodes) cut nothing: only
// their sizes are checked. Integer arithmetic: exact, and no overflow.
// The members are returned sorted by ID.
func checkShards(claims map[string]shardClaim, order []string, n int64) ([]string, *roundBlock) {
	var members []string
	var block *roundBlock
	leave := func(reason, format string, args ...any) {
		if block == nil {
			block = &roundBlock{reason, fmt.Sprintf(format, args...)}
		}
	}
	holder := make(map[int]string, len(order))
	var total int64
	var first string
	for _, id := range order {
		c := claims[id]
		if first != "" {
			f := claims[first]
			if c.count != f.count || c.seed != f.seed {
				leave(blockShardSplit, "node %s cuts the training set into %d shards with seed %d, node %s into %d with seed %d: %s left out",
					first, f.count, f.seed, id, c.count, c.seed, id)
				continue
			}
		}
		if other, dup := holder[c.index]; dup && c.count != 0 {
			leave(blockShardOverlap, "nodes %s and %s both hold shard %d of %d: %s, the later claim, left out", other, id, c.index, c.count, id)
			continue
		}
		if c.size > n-total {
			leave(blockShardSizes, "the live nodes' shards hold more than N = %d examples (node %s: %d, the nodes before it: %d): %s left out",
				n, id, c.size, total, id)
			continue
		}
		if first == "" {
			first = id
		}
		holder[c.index] = id
		total += c.size
		members = append(members, id)
	}
	slices.Sort(members)
	return members, block
}

// iidShardSize is the size of shard index of count IID shards of n
// examples (dataset.ShardIndicesIID: the first n mod count shards hold one
// more).
func iidShardSize(n int64, index, count int) int64 {
	size := n / int64(count)
	if int64(index) < n%int64(count) {
		size++
	}
	return size
}

// countLimits returns, for each member's shard size, the largest sample
// count its contribution may claim: aggregation.CountBound at the run's q,
// which an honest node's Poisson sample exceeds with probability at most
// aggregation.CountTail (2^-64). A contribution's norm is checked against
// count·C (aggregation), so this bounds what one authorized node can add
// to a step to about q·n + √(2·q·n·44) + 44 clipped examples' worth,
// instead of its whole shard's n (issue 27, finding 3). Refusing the rare
// honest sample above it is charged in δ (docs/PRIVACY.md).
func countLimits(sizes map[string]int64, q float64) map[string]int64 {
	limits := make(map[string]int64, len(sizes))
	for id, n := range sizes {
		limits[id] = aggregation.CountBound(n, q)
	}
	return limits
}

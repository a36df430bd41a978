// Package node is the worker side of a dpcluster training run: it holds a
// private data shard, Poisson-samples it each round, computes the sum of
// per-example gradients clipped to L2 norm C, and sends that sum and the
// batch count to the coordinator's leader. A node never sees another node's
// data and never adds noise; the leader does that once for the whole round.
package node

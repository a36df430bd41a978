// Package aggregation validates and sums the contributions of one training
// round: it accepts a contribution only for the open step, from a registered
// node, once, with the right shape, finite values and a norm no clipped sum
// can exceed, and sums in a fixed order so the result does not depend on
// arrival order.
package aggregation

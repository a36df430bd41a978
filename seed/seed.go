// Package seed names where a run's randomness comes from: its seed policy.
// One type, Policy, is shared by every package that records or checks it:
// the coordinator's RunConfig, the ledger's run record, the nodes' Join and
// Heartbeat messages (package transport), node.Config and the command line.
//
//	p, err := seed.ParsePolicy(s) // "crypto" or "seeded"
//	if !p.Private() { log.Warn("NOT differentially private") }
//
// It is a package of its own, with no dependencies, because its users
// include both the ledger (a leaf that must not import the NATS wire
// layer) and transport (which has no business importing the ledger). On the
// wire (msgpack) and on disk (JSON) a Policy is the plain string it holds,
// so encodings written before the type existed read back unchanged.
package seed

import (
	"errors"
	"fmt"
)

// Policy says how a component draws its differential-privacy randomness
// (the leader's noise, a node's Poisson samples).
type Policy string

const (
	// Crypto draws from a CSPRNG keyed from crypto/rand: private. It is
	// the default.
	Crypto Policy = "crypto"
	// Seeded draws from a seeded, predictable source, for tests and
	// reproducible experiments: NOT differentially private.
	Seeded Policy = "seeded"
)

// ErrUnknown is returned (wrapped) by ParsePolicy and Validate for a policy
// that is neither Crypto nor Seeded (the empty string included).
var ErrUnknown = errors.New("seed: unknown seed policy")

// ParsePolicy returns the policy named s, or ErrUnknown.
func ParsePolicy(s string) (Policy, error) {
	p := Policy(s)
	return p, p.Validate()
}

// Validate returns nil for Crypto and Seeded and wraps ErrUnknown for
// anything else.
func (p Policy) Validate() error {
	if p != Crypto && p != Seeded {
		return fmt.Errorf("%w: %q (want %q or %q)", ErrUnknown, string(p), Crypto, Seeded)
	}
	return nil
}

// Private reports whether randomness drawn under p keeps the run
// differentially private: true only for Crypto.
func (p Policy) Private() bool { return p == Crypto }

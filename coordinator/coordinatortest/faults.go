package coordinatortest

import (
	"slices"

	"github.com/dpcluster/dpcluster/transport/fake"
)

// Partition replaces the current partition: every replica or node named
// in one group is cut from every one named in another, and the replicas
// and nodes named in no group form one more group together. A cut stops
// both Raft (the in-memory transports disconnect, both directions) and
// NATS (fake.Network.Partition, both directions) between the two. The
// observer is never cut. Partition(nil) and Heal are the same.
func (c *Cluster) Partition(groups ...[]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.healLocked()
	named := make(map[string]bool)
	for _, g := range groups {
		for _, id := range g {
			named[id] = true
		}
	}
	var rest []string
	for _, id := range append(slices.Clone(c.order), c.nodeIDs...) {
		if !named[id] {
			rest = append(rest, id)
		}
	}
	if len(rest) > 0 {
		groups = append(groups, rest)
	}
	for i, a := range groups {
		for _, b := range groups[i+1:] {
			for _, x := range a {
				for _, y := range b {
					c.cutLocked(x, y)
				}
			}
		}
	}
}

// Cut adds a cut between a and b (replicas or nodes) to the current
// partition: cuts need not be transitive, so nodes may lose the leader
// and keep the followers.
func (c *Cluster) Cut(a, b string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cutLocked(a, b)
}

// Isolate cuts id (a replica or a node) from every other replica and node.
func (c *Cluster) Isolate(id string) { c.Partition([]string{id}) }

// Heal removes every cut, Raft and NATS.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.healLocked()
}

// SetFaults sets the NATS faults (drops, delays, duplicates, reordering;
// see fake.Faults) on every delivery, the observer's included. Raft
// traffic is not affected.
func (c *Cluster) SetFaults(f fake.Faults) { c.net.SetFaults(f) }

func (c *Cluster) cutLocked(a, b string) {
	if a == b || c.cut[[2]string{a, b}] {
		return
	}
	c.cut[[2]string{a, b}], c.cut[[2]string{b, a}] = true, true
	c.net.Partition(a, b)
	ma, mb := c.replicas[a], c.replicas[b]
	if ma != nil && mb != nil {
		ma.trans.Disconnect(mb.addr)
		mb.trans.Disconnect(ma.addr)
	}
}

func (c *Cluster) healLocked() {
	c.net.Heal()
	for k := range c.cut {
		ma, mb := c.replicas[k[0]], c.replicas[k[1]]
		if ma != nil && mb != nil && !ma.removed && !mb.removed {
			ma.trans.Connect(mb.addr, mb.trans)
		}
	}
	clear(c.cut)
}

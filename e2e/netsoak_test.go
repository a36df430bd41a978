//go:build unix

package e2e

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/internal/faultnet"
)

// netFaultKind is one kind of network fault the network soak injects.
type netFaultKind int

const (
	cutRaft         netFaultKind = iota // every Raft link to and from one replica cut
	cutLeaderNATS                       // the leader's NATS client and route ports cut
	delayReplica                        // every link of one replica delayed
	halfOpenReplica                     // one replica's Raft links and NATS client port stop forwarding one or both ways
	partitionLeader                     // the leader cut from the others: Raft both ways, its NATS client port, every route
	numNetFaultKinds
)

func (k netFaultKind) String() string {
	return [...]string{"cut-raft", "cut-leader-nats", "delay", "half-open", "partition-leader"}[k]
}

// netNet is the proxies between the replicas of a network soak. Every
// connection between processes goes through one of them:
//
//   - raft[i][j] carries replica i's Raft connections to replica j
//     (serve --raft-dial j=raft[i][j]), so a link can be cut one way or
//     both;
//   - client[j] is replica j's NATS client port for the nodes (the NATS
//     URLs they are given, and the one the server advertises);
//   - route[j] is replica j's NATS route port (the other members'
//     --nats-routes, and the route address j advertises).
//
// A route is one connection dialed by either member, so cutting route[j]
// only ends the routes dialed to j; partitionLeader cuts every route.
type netNet struct {
	raft          [][]*faultnet.Proxy // [from][to]; nil on the diagonal
	client, route []*faultnet.Proxy
}

// proxies returns the proxies that carry replica i's traffic: its Raft
// links both ways (or only the incoming ones), its client and route ports.
func (n *netNet) raftLinks(i int, incoming bool) []*faultnet.Proxy {
	var ps []*faultnet.Proxy
	for j := range n.raft {
		if j == i {
			continue
		}
		ps = append(ps, n.raft[j][i])
		if !incoming {
			ps = append(ps, n.raft[i][j])
		}
	}
	return ps
}

func (n *netNet) all() []*faultnet.Proxy {
	ps := append(append([]*faultnet.Proxy(nil), n.client...), n.route...)
	for i := range n.raft {
		ps = append(ps, n.raftLinks(i, true)...)
	}
	return ps
}

// startProxy starts a proxy to target on a free loopback port, closed in
// t.Cleanup (after the processes are killed: cleanups run last first).
func startProxy(t *testing.T, target string) *faultnet.Proxy {
	t.Helper()
	p, err := faultnet.Listen(FreeAddr(t), target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("closing the proxy to %s: %v", target, err)
		}
	})
	return p
}

// TestProcessNetworkSoak is issue 13's process-level soak with network
// faults: three `coordinator serve` replicas (each embedding a member of
// one NATS cluster) and three nodes, all OS processes, that reach each
// other only through fault-injecting TCP proxies (netNet). Every ~20 steps
// a fault drawn from a seeded RNG is injected for 1.5-4 s (or 10 steps, if
// training goes on meanwhile) and healed: a
// replica's Raft cut, the leader's NATS cut, a replica's links delayed,
// half-open links, the leader partitioned from the others. The run must
// make progress after every heal, and end with the invariants of
// TestProcessFailover (checkRunEnd): every replica exits 0 with the same
// state digest, byte-identical ledgers, each auditing clean with exactly
// the steps run.
//
// DPCLUSTER_NETSOAK_STEPS sets the steps (default 120, for CI: about 6 faults);
// DPCLUSTER_E2E_SEED picks another schedule. docs/RELIABILITY.md records
// the long run.
func TestProcessNetworkSoak(t *testing.T) {
	steps := int(envUint(t, "DPCLUSTER_NETSOAK_STEPS", 120))
	seed := envUint(t, "DPCLUSTER_E2E_SEED", 1)
	rng := rand.New(rand.NewPCG(seed, 13))
	cfg := runConfig{run: "e2e-netsoak", maxSteps: steps, nodes: 3, roundTimeout: 2 * time.Second}
	h := New(t)
	start := time.Now()
	cfg.writeRunFile(h)

	reps := make([]*replicaProc, 3)
	for i := range reps {
		id := fmt.Sprintf("r%d", i+1)
		reps[i] = &replicaProc{id: id, raftAddr: FreeAddr(t), natsAddr: FreeAddr(t), clusterAddr: FreeAddr(t),
			metricsAddr: FreeAddr(t), dataDir: h.Dir(id)}
	}
	net := &netNet{raft: make([][]*faultnet.Proxy, len(reps))}
	for i, r := range reps {
		net.raft[i] = make([]*faultnet.Proxy, len(reps))
		for j, o := range reps {
			if j != i {
				net.raft[i][j] = startProxy(t, o.raftAddr)
			}
		}
		net.client = append(net.client, startProxy(t, r.natsAddr))
		net.route = append(net.route, startProxy(t, r.clusterAddr))
	}
	var peers, natsURLs []string
	for i, r := range reps {
		peers = append(peers, r.id+"="+r.raftAddr)
		natsURLs = append(natsURLs, "nats://"+net.client[i].Addr())
	}
	for i, r := range reps {
		// Its own ID too: hashicorp/raft asks for it at times (and warns
		// when the provider has no answer).
		routes, dial := []string(nil), []string{r.id + "=" + r.raftAddr}
		for j, o := range reps {
			if j != i {
				routes = append(routes, "nats-route://"+net.route[j].Addr())
				dial = append(dial, o.id+"="+net.raft[i][j].Addr())
			}
		}
		args := []string{"serve", "--id", r.id, "--raft-addr", r.raftAddr, "--data-dir", r.dataDir,
			"--bootstrap", "--peers", strings.Join(peers, ","), "--raft-dial", strings.Join(dial, ","),
			"--nats-listen", r.natsAddr, "--nats-advertise", net.client[i].Addr(),
			"--nats-cluster", r.clusterAddr, "--nats-cluster-advertise", net.route[i].Addr(),
			"--nats-routes", strings.Join(routes, ","), "--metrics-addr", r.metricsAddr}
		r.p = h.Start(r.id, h.Bin.Coordinator, append(args, cfg.runFlags()...)...)
	}
	// A node's first connection must reach a NATS server: through a proxy,
	// a server not yet listening is a reset (not a refusal), on which a
	// node exits instead of retrying. Start the nodes once every embedded
	// server is up.
	for _, r := range reps {
		h.WaitFor(time.Minute, r.id+"'s embedded NATS server", func() (bool, error) {
			return strings.Contains(r.p.Logs(), "embedded NATS server"), r.p.exitedErr()
		})
	}
	nodes := make([]*Proc, cfg.nodes)
	for i := range nodes {
		nodes[i] = h.Start("node-"+strconv.Itoa(i), h.Bin.Node, cfg.nodeArgs(i, strings.Join(natsURLs, ","))...)
	}

	index := func(r *replicaProc) int {
		for i, o := range reps {
			if o == r {
				return i
			}
		}
		panic("not a replica")
	}
	// waitStep waits until some replica has applied step at and one
	// leads, or the run has finished (done: a replica reports the last
	// step, or every replica has exited, which checkRunEnd judges).
	waitStep := func(at int, what string) (step int, leader *replicaProc, done bool) {
		h.WaitFor(2*time.Minute, fmt.Sprintf("step ≥ %d with a leader (%s)", at, what), func() (bool, error) {
			step, leader = observeReplicas(reps, nil)
			done = step >= cfg.maxSteps || !slices.ContainsFunc(reps, func(r *replicaProc) bool { return r.p.Running() })
			return done || step >= at && leader != nil, nil
		})
		return step, leader, done
	}

	// A fault about every 20 steps: each lasts up to 10 steps, and the next
	// comes 5-14 steps after the cluster has recovered from the last.
	counts := make([]int, numNetFaultKinds)
	for at := 15 + rng.IntN(10); ; {
		kind := netFaultKind(rng.IntN(int(numNetFaultKinds)))
		hold := 1500*time.Millisecond + time.Duration(rng.IntN(2500))*time.Millisecond
		step, leader, done := waitStep(at, "before a fault")
		if done {
			break
		}
		victim := rng.IntN(len(reps))
		var hit []*faultnet.Proxy
		desc := ""
		switch kind {
		case cutRaft:
			hit = net.raftLinks(victim, false)
			desc = "cut Raft of " + reps[victim].id
			for _, p := range hit {
				p.Cut()
			}
		case cutLeaderNATS:
			l := index(leader)
			hit = []*faultnet.Proxy{net.client[l], net.route[l]}
			desc = "cut NATS of leader " + leader.id
			for _, p := range hit {
				p.Cut()
			}
		case delayReplica:
			d := time.Duration(20+rng.IntN(180)) * time.Millisecond
			hit = append(net.raftLinks(victim, false), net.client[victim], net.route[victim])
			desc = fmt.Sprintf("delay %v on %s", d, reps[victim].id)
			for _, p := range hit {
				p.Delay(d)
			}
		case halfOpenReplica:
			dir := []faultnet.Direction{faultnet.Upstream, faultnet.Downstream, faultnet.Both}[rng.IntN(3)]
			hit = append(net.raftLinks(victim, true), net.client[victim])
			desc = fmt.Sprintf("half-open (%v) Raft into and NATS clients of %s", dir, reps[victim].id)
			for _, p := range hit {
				p.HalfOpen(dir)
			}
		case partitionLeader:
			l := index(leader)
			hit = append(append(net.raftLinks(l, false), net.client[l]), net.route...)
			desc = "partition leader " + leader.id
			for _, p := range hit {
				p.Cut()
			}
		}
		counts[kind]++
		// The fault lasts hold, or 10 steps if training goes on meanwhile
		// (at tens of steps a second, a delay would span hundreds).
		t.Logf("step %d: %s for %v or 10 steps", step, desc, hold)
		injected := time.Now()
		h.WaitFor(hold+time.Minute, "the fault's end", func() (bool, error) {
			s, _ := observeReplicas(reps, nil)
			return time.Since(injected) >= hold || s >= step+10, nil
		})
		for _, p := range hit {
			p.Heal()
		}
		// Liveness: the run goes on after the heal.
		after, _, done := waitStep(step+1, "after healing: "+desc)
		t.Logf("healed; step %d", after)
		if done {
			break
		}
		at = after + 5 + rng.IntN(10)
	}

	checkRunEnd(h, cfg, reps, nodes)
	var byKind []string
	total := 0
	for k, n := range counts {
		byKind = append(byKind, fmt.Sprintf("%v %d", netFaultKind(k), n))
		total += n
	}
	var refused, cut int
	for _, p := range net.all() {
		st := p.Stats()
		refused, cut = refused+st.Refused, cut+st.Cut
	}
	t.Logf("seed %d: %d steps with %d network faults (%s) in %v; proxies cut %d connections and refused %d",
		seed, steps, total, strings.Join(byKind, ", "), time.Since(start).Round(time.Millisecond), cut, refused)
}

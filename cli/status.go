package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// statusReport is the output of `coordinator status` (--json).
type statusReport struct {
	Run      string          `json:"run"`
	Leader   string          `json:"leader"`
	Term     uint64          `json:"term"`
	Replicas []replicaStatus `json:"replicas"`
	Nodes    []string        `json:"nodes_seen"`
	// NodeShards is what each node seen last reported about its data
	// and sampling, in node ID order.
	NodeShards []nodeShard `json:"node_shards"`
}

// nodeShard is a node's shard identity and seed policy, from its last
// Join or Heartbeat.
type nodeShard struct {
	ID         string      `json:"id"`
	ShardIndex int         `json:"shard_index"`
	ShardCount int         `json:"shard_count"`
	ShardSeed  uint64      `json:"shard_seed"`
	ShardSize  int64       `json:"shard_size"`
	SeedPolicy seed.Policy `json:"seed_policy"`
}

type replicaStatus struct {
	ID      string `json:"id"`
	Role    string `json:"role"`
	Term    uint64 `json:"term"`
	Applied uint64 `json:"applied_step"`
	// Charged is the last step the replica's ledger charged, the step
	// Epsilon runs through: Applied, or one more (a step charged ahead of
	// its g̃, or one the run ended before applying). Omitted for a replica
	// too old to report it.
	Charged uint64  `json:"charged_step,omitempty"`
	Epsilon float64 `json:"epsilon"`
	Nodes   int     `json:"nodes"`
	Leader  string  `json:"leader"`
	// Blocked is why this replica, leading, opens no round (empty: it
	// does not block them).
	Blocked string `json:"blocked,omitempty"`
	// Waiting says this replica, leading, opens no round for lack of live
	// nodes: how many it has of how many it needs, and the run's named
	// nodes missing (empty: it does not wait).
	Waiting string `json:"waiting,omitempty"`
	// Standing lists the live nodes this replica, leading, does not wait
	// for in its rounds, being out of good standing, each with why and
	// since which step (empty: none).
	Standing string `json:"standing,omitempty"`
	// Insecure says the replica runs without TLS (started with
	// --insecure): the run's transport is not protected.
	Insecure bool `json:"insecure,omitempty"`
}

func newStatusCmd() *cobra.Command {
	var (
		nats, runName          string
		tlsCA, tlsCert, tlsKey string
		wait                   time.Duration
		asJSON                 bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a run's coordinator replicas, leader, steps, ε spent and nodes, as seen on NATS",
		Long: `status listens on the run's NATS subjects for --wait and reports what it heard: every
coordinator replica's periodic state (role, Raft term, last applied step, last step charged and the
ε spent through it, live nodes, why a leader opens no round when the live nodes' shards overlap,
and whether the replica runs without TLS, started with --insecure), the current leader's
announcement, and the nodes that sent heartbeats with the shard and seed policy they report. It
exits non-zero if no replica was heard. Over TLS give --tls-ca, --tls-cert and --tls-key: an
observer certificate is enough (it may read these subjects and publish nothing).`,
		Example: `  coordinator status --nats nats://10.0.0.1:4222,nats://10.0.0.2:4222 --run fashion-mlp
  coordinator status --nats tls://10.0.0.1:4222 --run fashion-mlp \
      --tls-ca certs/ca.crt --tls-cert certs/ops.crt --tls-key certs/ops.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nats == "" {
				return errors.New("--nats is required")
			}
			if wait <= 0 {
				return fmt.Errorf("--wait %v must be positive", wait)
			}
			files, err := tlsFiles(tlsCA, tlsCert, tlsKey)
			if err != nil {
				return err
			}
			rep, err := collectStatus(cmd.Context(), strings.Split(nats, ","), files, runName, wait)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printStatus(out, rep)
			}
			if len(rep.Replicas) == 0 {
				return fmt.Errorf("no coordinator replica of run %q heard within %v", runName, wait)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&nats, "nats", "", "NATS server URLs, comma-separated (required)")
	fs.StringVar(&runName, "run", defaultRunSpec().Run, "run name")
	fs.DurationVar(&wait, "wait", 2500*time.Millisecond, "how long to listen (replicas report every second)")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	bindTLSFlags(fs, &tlsCA, &tlsCert, &tlsKey, "a certificate of the run: an observer's will do")
	return cmd
}

// collectStatus listens on the run's control, leader and node subjects for
// wait, over TLS with files if set, and returns what it heard.
// refusedRun explains a subscription the servers refuse: they scope every
// permission to their run's subjects, so it is most often a wrong --run.
func refusedRun(run string, err error) error {
	if !errors.Is(err, transport.ErrPermission) {
		return err
	}
	return fmt.Errorf("--run %s: the servers refuse this certificate's subscription to the run's subjects: "+
		"no run of that name is served there (give the name in the run file), or the certificate may not read them "+
		"(an observer or replica certificate may): %w", run, err)
}

func collectStatus(ctx context.Context, urls []string, files transport.TLSConfig, run string, wait time.Duration) (statusReport, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	rep := statusReport{Run: run}
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs, cfg.TLS = run, urls, files
	if files.CertFile == "" {
		cfg.Name = "status"
	}
	conn, err := transport.Connect(ctx, cfg, nil)
	if err != nil {
		return rep, refusedRun(run, err)
	}
	defer conn.Close()
	var (
		mu       sync.Mutex
		replicas = map[string]replicaStatus{}
		nodes    = map[string]nodeShard{}
	)
	handlers := map[transport.Topic]transport.Handler{
		transport.TopicControl: func(m transport.Message) {
			if c := m.(transport.Control); c.Code == transport.ControlReplica {
				mu.Lock()
				replicas[c.From] = replicaStatus{ID: c.From, Role: c.Role, Term: c.Term, Applied: c.Step, Charged: c.Charged,
					Epsilon: c.Epsilon, Nodes: c.Nodes, Leader: c.Leader, Blocked: c.Blocked, Waiting: c.Waiting, Standing: c.Standing, Insecure: c.Insecure}
				mu.Unlock()
			}
		},
		transport.TopicLeader: func(m transport.Message) {
			l := m.(transport.Leader)
			mu.Lock()
			if l.Term >= rep.Term {
				rep.Leader, rep.Term = l.ReplicaID, l.Term
			}
			mu.Unlock()
		},
		transport.TopicNodes: func(m transport.Message) {
			var n nodeShard
			switch v := m.(type) {
			case transport.Join:
				n = nodeShard{ID: v.NodeID, ShardIndex: v.ShardIndex, ShardCount: v.ShardCount, ShardSeed: v.ShardSeed,
					ShardSize: v.ShardSize, SeedPolicy: v.SeedPolicy}
			case transport.Heartbeat:
				n = nodeShard{ID: v.NodeID, ShardIndex: v.ShardIndex, ShardCount: v.ShardCount, ShardSeed: v.ShardSeed,
					ShardSize: v.ShardSize, SeedPolicy: v.SeedPolicy}
			}
			if n.ID != "" {
				mu.Lock()
				nodes[n.ID] = n
				mu.Unlock()
			}
		},
	}
	for topic, h := range handlers {
		if _, err := conn.Subscribe(topic, h); err != nil {
			return rep, refusedRun(run, err)
		}
	}
	select {
	case <-ctx.Done():
		return rep, ctx.Err()
	case <-time.After(wait):
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(replicas)) {
		rep.Replicas = append(rep.Replicas, replicas[id])
	}
	rep.Nodes = slices.Sorted(maps.Keys(nodes))
	if rep.Nodes == nil {
		rep.Nodes = []string{}
	}
	rep.NodeShards = make([]nodeShard, 0, len(rep.Nodes))
	for _, id := range rep.Nodes {
		rep.NodeShards = append(rep.NodeShards, nodes[id])
	}
	return rep, nil
}

func printStatus(w interface{ Write([]byte) (int, error) }, rep statusReport) {
	leader := rep.Leader
	if leader == "" {
		leader = "(none heard)"
	}
	fmt.Fprintf(w, "run %s: leader %s (term %d)\n", rep.Run, leader, rep.Term)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tROLE\tTERM\tAPPLIED\tCHARGED\tε SPENT\tNODES\tLEADER")
	for _, r := range rep.Replicas {
		charged := "–" // a replica too old to report it
		if r.Charged > 0 || r.Applied == 0 {
			charged = fmt.Sprint(r.Charged)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%.4f\t%d\t%s\n", r.ID, r.Role, r.Term, r.Applied, charged, r.Epsilon, r.Nodes, r.Leader)
	}
	tw.Flush()
	for _, r := range rep.Replicas {
		if r.Blocked != "" {
			fmt.Fprintf(w, "NODES LEFT OUT by %s: %s\n", r.ID, r.Blocked)
		}
		if r.Waiting != "" {
			fmt.Fprintf(w, "NO ROUND YET: leader %s is %s\n", r.ID, r.Waiting)
		}
		if r.Standing != "" {
			fmt.Fprintf(w, "NODES OUT OF GOOD STANDING at leader %s: %s\n", r.ID, r.Standing)
		}
	}
	for _, r := range rep.Replicas {
		if r.Insecure {
			fmt.Fprintf(w, "TRANSPORT NOT PROTECTED: replica %s runs without TLS (--insecure); whoever reaches the run's "+
				"addresses can read the nodes' un-noised sums and command the run\n", r.ID)
		}
	}
	fmt.Fprintf(w, "nodes seen (%d): %s\n", len(rep.Nodes), strings.Join(rep.Nodes, " "))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, n := range rep.NodeShards {
		policy := string(n.SeedPolicy)
		switch n.SeedPolicy {
		case "":
			policy = "- (not reported)"
		case seed.Seeded:
			policy = "SEEDED: NOT private"
		}
		fmt.Fprintf(tw, "  %s\tshard %d/%d\tseed %d\t%d examples\t%s\n", n.ID, n.ShardIndex, n.ShardCount, n.ShardSeed, n.ShardSize, policy)
	}
	tw.Flush()
}

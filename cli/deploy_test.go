package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/dpcluster/dpcluster/dataset"
)

// TestExampleRunFile: examples/run.yaml, the run file docker-compose.yml
// mounts into every container, parses with the replicas' parser and
// derives the README's main job.
func TestExampleRunFile(t *testing.T) {
	spec := defaultRunSpec()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	spec.bind(fs)
	if err := loadRunSpec(&spec, filepath.Join("..", "examples", "run.yaml"), fs); err != nil {
		t.Fatal(err)
	}
	m, err := loadModel(spec.Model, spec.ModelSpec)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := spec.runConfig(m, 60000, "", false, "", nil) // Fashion-MNIST's training split
	if err != nil {
		t.Fatal(err)
	}
	if rc.Run != "fashion-mlp" || spec.Dataset != dataset.NameFashionMNIST || rc.SampleRate != 256.0/60000 ||
		rc.Optimizer.ClipNorm != 1 || rc.TargetEpsilon != 3 || rc.MaxSteps != 1000 || spec.MinNodes != 3 {
		t.Errorf("examples/run.yaml: %+v, min nodes %d", rc, spec.MinNodes)
	}
}

// TestDockerCompose: every command in docker-compose.yml parses with the
// binaries' flags; every node and the coordinator read the mounted run
// file; the nodes hold distinct shards of one cut. The run is secure: a
// one-shot certs service writes the certificates of every replica and node
// (valid for the host the nodes dial), the others start after it has
// succeeded and use their own certificate, without --insecure, and their
// addresses pass the secure-by-default rule (checkTransportSecurity).
func TestDockerCompose(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	type service struct {
		Command   []string `yaml:"command"`
		Volumes   []string `yaml:"volumes"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	}
	var compose struct {
		Services map[string]service `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	certs, ok := compose.Services["certs"]
	if !ok || len(certs.Command) < 3 || !slices.Equal(certs.Command[:3], []string{"coordinator", "certs", "init"}) {
		t.Fatalf("no certs service running coordinator certs init: %+v", certs)
	}
	initCmd := parseCoordinatorCmd(t, certs.Command[1:])
	flag := func(cmd *cobra.Command, name string) string {
		t.Helper()
		f := cmd.Flags().Lookup(name)
		if f == nil {
			t.Fatalf("%s has no --%s", cmd.Name(), name)
		}
		return f.Value.String()
	}
	list := func(cmd *cobra.Command, name string) []string {
		v, _ := cmd.Flags().GetStringSlice(name)
		return v
	}
	if dir := flag(initCmd, "dir"); dir != "/certs" || !slices.Contains(certs.Volumes, "certs:/certs") {
		t.Errorf("certs init writes to %s, volumes %v; want the certs volume at /certs", dir, certs.Volumes)
	}
	hosts := list(initCmd, "hosts")

	const runFile = "--config=/etc/dpcluster/run.yaml"
	const mount = "./examples/run.yaml:/etc/dpcluster/run.yaml:ro"
	var indexes []int
	counts := map[int]bool{}
	nodes := 0
	for name, svc := range compose.Services {
		if len(svc.Command) == 0 || name == "certs" {
			continue
		}
		var (
			cmd  *cobra.Command
			ids  []string // the IDs certs init issues for this role
			eps  []endpoint
			dial []string // hosts this process verifies a server certificate for
		)
		switch svc.Command[0] {
		case "node":
			nodes++
			cmd = NewNodeCmd()
			if err := cmd.ParseFlags(svc.Command[1:]); err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			i, _ := cmd.Flags().GetInt("shard-index")
			k, _ := cmd.Flags().GetInt("shard-count")
			indexes, counts[k] = append(indexes, i), true
			ids = list(initCmd, "nodes")
			urls := strings.Split(flag(cmd, "nats"), ",")
			eps = endpoints("--nats", urls...)
			for _, u := range urls {
				h, err := addrHost(u)
				if err != nil {
					t.Errorf("%s: --nats %s: %v", name, u, err)
				}
				dial = append(dial, h)
			}
		case "coordinator":
			cmd = parseCoordinatorCmd(t, svc.Command[1:])
			if cmd.Name() != "serve" {
				continue
			}
			ids = list(initCmd, "replicas")
			f := serveFlags{raftAddr: flag(cmd, "raft-addr"), nats: flag(cmd, "nats"), natsListen: flag(cmd, "nats-listen"),
				natsCluster: flag(cmd, "nats-cluster"), natsRoutes: flag(cmd, "nats-routes")}
			peers, err := parsePeers(flag(cmd, "peers"))
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			eps = f.endpoints(peers)
		default:
			continue
		}
		if !slices.Contains(svc.Command, runFile) {
			t.Errorf("%s does not read the run file (%s): %s", name, runFile, strings.Join(svc.Command, " "))
		}
		if !slices.Contains(svc.Volumes, mount) || !slices.Contains(svc.Volumes, "certs:/certs:ro") {
			t.Errorf("%s does not mount the run file and the certificates (read-only): volumes %v", name, svc.Volumes)
		}
		if c := svc.DependsOn["certs"].Condition; c != "service_completed_successfully" {
			t.Errorf("%s starts without waiting for the certificates: depends_on certs %q", name, c)
		}
		id := flag(cmd, "id")
		if !slices.Contains(ids, id) {
			t.Errorf("%s: --id %s, but certs init issues %v for its role", name, id, ids)
		}
		for f, want := range map[string]string{"tls-ca": "/certs/ca.crt", "tls-cert": "/certs/" + id + ".crt", "tls-key": "/certs/" + id + ".key"} {
			if got := flag(cmd, f); got != want {
				t.Errorf("%s: --%s %q, want %q", name, f, got, want)
			}
		}
		insecure, _ := cmd.Flags().GetBool("insecure")
		open := 0
		for _, e := range eps {
			if loop, _ := loopbackAddr(e.addr); !loop {
				open++
			}
		}
		if err := checkTransportSecurity(eps, tlsFlagsGiven(cmd.Flags()), insecure); err != nil || insecure || open == 0 {
			t.Errorf("%s: transport check %v, --insecure %v, %d non-loopback addresses; want TLS across the network", name, err, insecure, open)
		}
		for _, h := range dial {
			if !slices.Contains(hosts, h) {
				t.Errorf("%s dials %s, which the certificates (--hosts %v) are not valid for", name, h, hosts)
			}
		}
	}
	slices.Sort(indexes)
	if nodes != 3 || len(counts) != 1 || !counts[3] || !slices.Equal(indexes, []int{0, 1, 2}) {
		t.Errorf("nodes: %d, shard counts %v, indexes %v; want 3 nodes holding shards 0, 1, 2 of 3", nodes, counts, indexes)
	}
}

// parseCoordinatorCmd finds the coordinator subcommand args names and
// parses its flags.
func parseCoordinatorCmd(t *testing.T, args []string) *cobra.Command {
	t.Helper()
	sub, rest, err := NewCoordinatorCmd().Find(args)
	if err == nil {
		err = sub.ParseFlags(rest)
	}
	if err != nil {
		t.Fatalf("coordinator %s: %v", strings.Join(args, " "), err)
	}
	return sub
}

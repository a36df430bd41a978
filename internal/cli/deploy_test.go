package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// TestExampleRunFile: examples/run.yaml, the run file docker-compose.yml
// mounts into every container, parses with the replicas' parser and
// derives the README's main job.
func TestExampleRunFile(t *testing.T) {
	spec := defaultRunSpec()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	spec.bind(fs)
	if err := loadRunSpec(&spec, filepath.Join("..", "..", "examples", "run.yaml"), fs); err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel(spec.Model, spec.ModelSpec)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := spec.runConfig(m, 60000, false) // Fashion-MNIST's training split
	if err != nil {
		t.Fatal(err)
	}
	if rc.Run != "fashion-mlp" || spec.Dataset != DatasetFashionMNIST || rc.SampleRate != 256.0/60000 ||
		rc.Optimizer.ClipNorm != 1 || rc.TargetEpsilon != 3 || rc.MaxSteps != 1000 || spec.MinNodes != 3 {
		t.Errorf("examples/run.yaml: %+v, min nodes %d", rc, spec.MinNodes)
	}
}

// TestDockerCompose: every command in docker-compose.yml parses with the
// binaries' flags; every node and the coordinator read the mounted run
// file; the nodes hold distinct shards of one cut.
func TestDockerCompose(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	const runFile = "--config=/etc/dpcluster/run.yaml"
	const mount = "./examples/run.yaml:/etc/dpcluster/run.yaml:ro"
	var indexes []int
	counts := map[int]bool{}
	nodes := 0
	for name, svc := range compose.Services {
		if len(svc.Command) == 0 {
			continue
		}
		switch svc.Command[0] {
		case "node":
			nodes++
			cmd := NewNodeCmd()
			if err := cmd.ParseFlags(svc.Command[1:]); err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			i, _ := cmd.Flags().GetInt("shard-index")
			k, _ := cmd.Flags().GetInt("shard-count")
			indexes, counts[k] = append(indexes, i), true
		case "coordinator":
			cmd := NewCoordinatorCmd()
			sub, rest, err := cmd.Find(svc.Command[1:])
			if err == nil {
				err = sub.ParseFlags(rest)
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		default:
			continue
		}
		if !slices.Contains(svc.Command, runFile) {
			t.Errorf("%s does not read the run file (%s): %s", name, runFile, strings.Join(svc.Command, " "))
		}
		if !slices.Contains(svc.Volumes, mount) {
			t.Errorf("%s does not mount the run file: volumes %v", name, svc.Volumes)
		}
	}
	slices.Sort(indexes)
	if nodes != 3 || len(counts) != 1 || !counts[3] || !slices.Equal(indexes, []int{0, 1, 2}) {
		t.Errorf("nodes: %d, shard counts %v, indexes %v; want 3 nodes holding shards 0, 1, 2 of 3", nodes, counts, indexes)
	}
}

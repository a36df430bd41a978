package cli

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// settleNodeWith parses args as the node command's flags and settles
// them with the environment env (settleNode).
func settleNodeWith(t *testing.T, args, env []string) (runSpec, nodeFlags, error) {
	t.Helper()
	spec := defaultRunSpec()
	f := nodeFlags{id: "default-id", shardCount: 1, heartbeat: time.Second, device: "cpu", logFormat: "text", logLevel: "info"}
	fs := pflag.NewFlagSet("node", pflag.ContinueOnError)
	bindNodeFlags(fs, &spec, &f)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	_, err := settleNode(fs, &spec, &f, env)
	return spec, f, err
}

// TestNodeFlagsFromEnvironment: every node flag can be given as its DPC_
// variable (the flag's name in capitals, - as _), which a systemd unit's
// environment file sets. The command line wins over the environment,
// which wins over the run file; an empty value is a value (a headerless
// CSV says "no label column" over the run file's); a variable that names
// no flag, or a value the flag refuses, is an error naming it.
func TestNodeFlagsFromEnvironment(t *testing.T) {
	runFile := writeRunFile(t, "label_column: label", "feature_columns: [a, b]")
	env := []string{"HOME=/root", "DPC_CONFIG=" + runFile, "DPC_NATS=nats://127.0.0.1:4222", "DPC_ID=site-a",
		"DPC_LABEL_COLUMN=", "DPC_BATCH_SIZE=50", "DPC_FEATURE_COLUMNS=x,y,z", "DPC_HEARTBEAT=250ms", "DPC_INSECURE=true"}
	spec, f, err := settleNodeWith(t, []string{"--batch-size", "70"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if f.config != runFile || f.nats != "nats://127.0.0.1:4222" || f.id != "site-a" || f.heartbeat != 250*time.Millisecond || !f.insecure {
		t.Errorf("node flags from the environment: %+v", f)
	}
	if spec.LabelColumn != "" {
		t.Errorf("DPC_LABEL_COLUMN= over the run file's label_column: label: got %q, want none", spec.LabelColumn)
	}
	if spec.BatchSize != 70 {
		t.Errorf("--batch-size 70 with DPC_BATCH_SIZE=50 and the run file's 100: %v, want the flag's", spec.BatchSize)
	}
	if !slices.Equal(spec.FeatureColumns, []string{"x", "y", "z"}) {
		t.Errorf("DPC_FEATURE_COLUMNS over the run file's: %q", spec.FeatureColumns)
	}

	// Without the variable the run file's value stands.
	spec, _, err = settleNodeWith(t, nil, env[:3])
	if err != nil || spec.LabelColumn != "label" || spec.BatchSize != 100 {
		t.Errorf("run file alone: label column %q, batch size %v, %v", spec.LabelColumn, spec.BatchSize, err)
	}

	for _, tc := range []struct{ env, want string }{
		{"DPC_LABLE_COLUMN=x", "DPC_LABLE_COLUMN names no flag (--lable-column)"},
		{"DPC_SHARD_COUNT=two", "DPC_SHARD_COUNT=two (--shard-count)"},
	} {
		_, _, err := settleNodeWith(t, nil, append(slices.Clone(env[:3]), tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", tc.env, err, tc.want)
		}
	}
}

package cli

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/pki"
)

// tlsArgs returns the --tls-* flags of id's certificate in dir.
func tlsArgs(dir, id string) []string {
	return []string{"--tls-ca", filepath.Join(dir, pki.CACertFile),
		"--tls-cert", filepath.Join(dir, id+".crt"), "--tls-key", filepath.Join(dir, id+".key")}
}

// TestServeOverTLS: `coordinator serve` with the TLS flags embeds a NATS
// server that requires mutual TLS. `coordinator status` with an observer
// certificate sees the replica lead (without one it cannot connect);
// `remove-replica` refuses any certificate but a replica's before
// publishing anything; a node refuses a certificate for another ID; and
// two `node` commands with their node certificates train with the replica
// to the end.
func TestServeOverTLS(t *testing.T) {
	certs := filepath.Join(t.TempDir(), "certs")
	if _, err := pki.Init(certs, []pki.Name{{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleNode, ID: "n0"},
		{Role: pki.RoleNode, ID: "n1"}, {Role: pki.RoleObserver, ID: "ops"}}, nil, 1); err != nil {
		t.Fatal(err)
	}
	const runName = "t-tls"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runFile := writeRunFile(t, "run: "+runName, "batch_size: 300", "max_steps: 30", "min_nodes: 2", "round_timeout: 20s")
	listen := freeAddrString(t)
	url := "tls://" + listen
	dir := t.TempDir()
	type result struct {
		out string
		err error
	}
	served := make(chan result, 1)
	go func() {
		out, err := run(t, append([]string{"serve", "--config", runFile, "--nats-listen", listen, "--id", "r1",
			"--raft-addr", freeAddrString(t), "--data-dir", dir, "--bootstrap", "--insecure-seed", "4"}, tlsArgs(certs, "r1")...)...)
		served <- result{out, err}
	}()

	// Before any node joins (so the run waits): `status` with an observer
	// certificate sees the replica lead.
	var st statusReport
	for deadline := time.Now().Add(time.Minute); ; {
		sout, _ := run(t, append([]string{"status", "--nats", url, "--run", runName, "--wait", "1200ms", "--json"}, tlsArgs(certs, "ops")...)...)
		if json.Unmarshal([]byte(sout), &st) == nil && len(st.Replicas) == 1 && st.Leader == "r1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status over TLS never showed r1 leading; last: %s", sout)
		}
	}
	if _, err := run(t, "status", "--nats", strings.Replace(url, "tls://", "nats://", 1), "--run", runName, "--wait", "300ms"); err == nil {
		t.Error("status without a certificate succeeded")
	}
	// Issue 27, papercut: a wrong run name was a bare permissions violation.
	_, err := run(t, append([]string{"status", "--nats", url, "--run", "no-such-run", "--wait", "300ms"}, tlsArgs(certs, "ops")...)...)
	if err == nil || !strings.Contains(err.Error(), `--run no-such-run: the servers refuse`) || !strings.Contains(err.Error(), "no run of that name") {
		t.Errorf("status --run no-such-run: %v, want an error saying there may be no such run", err)
	}
	for _, id := range []string{"n0", "ops"} {
		_, err := run(t, append([]string{"remove-replica", "r1", "--nats", url, "--run", runName}, tlsArgs(certs, id)...)...)
		if err == nil || !strings.Contains(err.Error(), "a replica certificate is needed") {
			t.Errorf("remove-replica with %s's certificate: %v", id, err)
		}
	}
	out, err := run(t, append([]string{"remove-replica", "r9", "--nats", url, "--run", runName}, tlsArgs(certs, "r1")...)...)
	if err != nil || !strings.Contains(out, "asked the leader") {
		t.Errorf("remove-replica with a replica certificate: %q, %v", out, err)
	}
	// A node whose certificate is another node's is refused before it
	// joins.
	err = runNodeCmd(ctx, io.Discard, append([]string{"--config", runFile, "--nats", url, "--id", "n0"}, tlsArgs(certs, "n1")...)...)
	if err == nil || !strings.Contains(err.Error(), "node n1's certificate, not n0's") {
		t.Errorf("node n0 with n1's certificate: %v", err)
	}

	nodeDone := make(chan error, 2)
	for i := range 2 {
		id := "n" + string(rune('0'+i))
		go func() {
			nodeDone <- runNodeCmd(ctx, io.Discard, append([]string{"--config", runFile, "--nats", url, "--id", id,
				"--shard-index", string(rune('0' + i)), "--shard-count", "2", "--insecure-seed", "9"}, tlsArgs(certs, id)...)...)
		}()
	}
	res := <-served
	if res.err != nil || !strings.Contains(res.out, "finished after 30 steps") {
		t.Fatalf("serve over TLS: %q, %v", res.out, res.err)
	}
	for range 2 {
		select {
		case err := <-nodeDone:
			if err != nil {
				t.Errorf("node: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("nodes did not stop after the run finished")
		}
	}
}

// TestTLSFlagsGoTogether: every command that takes the TLS flags wants
// all three or none.
func TestTLSFlagsGoTogether(t *testing.T) {
	for _, args := range [][]string{
		{"status", "--nats", "nats://127.0.0.1:1", "--tls-ca", "ca.crt"},
		{"remove-replica", "r2", "--nats", "nats://127.0.0.1:1", "--tls-cert", "r1.crt", "--tls-key", "r1.key"},
		{"local", "--tls-key", "r1.key"},
	} {
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "go together") {
			t.Errorf("%v: %v", args, err)
		}
	}
	err := runNodeCmd(context.Background(), io.Discard, "--config", "run.yaml", "--nats", "nats://127.0.0.1:1", "--tls-ca", "ca.crt")
	if err == nil || !strings.Contains(err.Error(), "go together") {
		t.Errorf("node: %v", err)
	}
}

// TestLocalOverTLS: `coordinator local` with a replica certificate runs
// its embedded server over mutual TLS, and its in-process replica and
// nodes train through it.
func TestLocalOverTLS(t *testing.T) {
	certs := filepath.Join(t.TempDir(), "certs")
	if _, err := pki.Init(certs, []pki.Name{{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleNode, ID: "n0"}}, nil, 1); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, append(localArgs(t.TempDir(), "--max-steps", "10"), tlsArgs(certs, "r1")...)...)
	if err != nil {
		t.Fatal(err)
	}
	var res localResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Steps != 10 {
		t.Fatalf("local over TLS: %+v, %v\n%s", res, err, out)
	}
	if _, err := run(t, append(localArgs(t.TempDir(), "--max-steps", "10"), tlsArgs(certs, "n0")...)...); err == nil ||
		!strings.Contains(err.Error(), "a replica certificate is needed") {
		t.Errorf("local with a node certificate: %v", err)
	}
}

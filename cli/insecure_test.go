package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/transport"
)

func TestLoopbackAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:4222", true},
		{"127.1.2.3:7000", true}, // all of 127.0.0.0/8
		{"127.255.255.254:1", true},
		{"[::1]:4222", true},
		{"[::ffff:127.0.0.1]:4222", true}, // IPv4-mapped
		{"[::1%lo]:4222", true},
		{"localhost:4222", true},
		{"LocalHost.:4222", true},
		{"localhost", true}, // a NATS URL without scheme or port
		{"nats://127.0.0.1:4222", true},
		{"nats://user:secret@localhost:4222", true},
		{"tls://[::1]:4222", true},
		{"nats-route://127.0.0.1:6222", true},
		{"0.0.0.0:4222", false}, // every interface
		{":4222", false},        // every interface
		{"[::]:4222", false},
		{"nats://:4222", false},
		{"nats://0.0.0.0:4222", false},
		{"10.1.2.3:4222", false},
		{"nats://10.1.2.3:4222", false},
		{"128.0.0.1:1", false},
		{"[::2]:1", false},
		{"[fe80::1%eth0]:1", false},
		{"coordinator:7000", false}, // a name, never looked up
		{"localhost.example.com:1", false},
		{"mylocalhost:1", false},
		{"nats://coord.example.com:4222", false},
		{"10.0.0.1", false},
	} {
		got, err := loopbackAddr(tc.addr)
		if err != nil || got != tc.want {
			t.Errorf("loopbackAddr(%q) = %v, %v; want %v", tc.addr, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "nats://", "nats://[::1", "nats://host:port", "::1", "[::1]", "nats://a b:1", "user@host"} {
		if got, err := loopbackAddr(bad); err == nil {
			t.Errorf("loopbackAddr(%q) = %v, nil; want an error", bad, got)
		}
	}
}

func TestCheckTransportSecurity(t *testing.T) {
	loop := []endpoint{{"--raft-addr", "127.0.0.1:7000"}, {"--nats", "nats://localhost:4222"}}
	open := append(append([]endpoint{}, loop...), endpoint{"--nats-listen", "0.0.0.0:4222"}, endpoint{"--peers", "10.0.0.2:7000"})
	for _, tc := range []struct {
		name          string
		eps           []endpoint
		tls, insecure bool
		wantInsecure  bool   // errors.Is ErrInsecureTransport
		wantErr       string // "" for no error
	}{
		{"loopback only", loop, false, false, false, ""},
		{"no addresses", nil, false, false, false, ""},
		{"open without TLS", open, false, false, true, "--nats-listen 0.0.0.0:4222, --peers 10.0.0.2:7000 are not loopback"},
		{"open with TLS", open, true, false, false, ""},
		{"open with --insecure", open, false, true, false, ""},
		{"TLS and --insecure", loop, true, true, false, "exclude each other"},
		{"bad address", []endpoint{{"--nats", "nats://[::1"}}, false, false, false, `--nats "nats://[::1"`},
		{"bad address with TLS", []endpoint{{"--raft-addr", "::1"}}, true, false, false, `--raft-addr "::1"`},
	} {
		err := checkTransportSecurity(tc.eps, tc.tls, tc.insecure)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.wantErr)
		case errors.Is(err, ErrInsecureTransport) != tc.wantInsecure:
			t.Errorf("%s: %v: errors.Is(ErrInsecureTransport) = %v, want %v", tc.name, err, !tc.wantInsecure, tc.wantInsecure)
		}
		if tc.wantInsecure && err != nil {
			for _, flag := range []string{"--tls-ca", "--tls-cert", "--tls-key", "--insecure"} {
				if !strings.Contains(err.Error(), flag) {
					t.Errorf("%s: %q does not name %s", tc.name, err, flag)
				}
			}
		}
	}
}

// runServeCmd executes `coordinator serve` with args under ctx; stderr (the
// logs) goes to logs.
func runServeCmd(ctx context.Context, logs io.Writer, args ...string) error {
	cmd := NewCoordinatorCmd()
	cmd.SetOut(io.Discard)
	cmd.SetErr(logs)
	cmd.SetArgs(append([]string{"serve", "--model", "logreg", "--dataset", "gaussian"}, args...))
	return cmd.ExecuteContext(ctx)
}

// TestServeRefusesOpenAddressWithoutTLS: serve asked to listen on or dial
// an address off the loopback interface without TLS flags exits at once
// with ErrInsecureTransport, naming the flag, the TLS flags and --insecure;
// it has started nothing: no data dir, no log line. Before the check, serve
// started and served until its context ended.
func TestServeRefusesOpenAddressWithoutTLS(t *testing.T) {
	port := strings.TrimPrefix(freeAddrString(t), "127.0.0.1:")
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--nats-listen", "0.0.0.0:" + port}, "--nats-listen 0.0.0.0:" + port},
		{[]string{"--nats-listen", ":" + port}, "--nats-listen :" + port},
		{[]string{"--nats-listen", "[::]:" + port}, "--nats-listen [::]:" + port},
		{[]string{"--raft-addr", "10.0.0.1:7000"}, "--raft-addr 10.0.0.1:7000"},
		{[]string{"--raft-addr", "coordinator:7000"}, "--raft-addr coordinator:7000"},
		{[]string{"--peers", "r1=127.0.0.1:7000,r2=10.0.0.2:7000"}, "--peers 10.0.0.2:7000"},
		{[]string{"--nats", "nats://127.0.0.1:4222,nats://10.1.2.3:4222"}, "--nats nats://10.1.2.3:4222"},
		{[]string{"--nats-cluster", "0.0.0.0:6222"}, "--nats-cluster 0.0.0.0:6222"},
		{[]string{"--nats-cluster", "127.0.0.1:6222", "--nats-routes", "nats-route://10.0.0.2:6222"}, "--nats-routes nats-route://10.0.0.2:6222"},
		// Only a partial TLS configuration: not TLS.
		{[]string{"--nats-listen", "0.0.0.0:" + port, "--tls-ca", "ca.crt"}, "--nats-listen 0.0.0.0:" + port},
	} {
		dataDir := filepath.Join(t.TempDir(), "r1")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var logs lockedBuffer
		err := runServeCmd(ctx, &logs, append([]string{"--id", "r1", "--data-dir", dataDir, "--bootstrap"}, tc.args...)...)
		ended := ctx.Err()
		cancel()
		if !errors.Is(err, ErrInsecureTransport) {
			t.Errorf("%v: err = %v, want ErrInsecureTransport", tc.args, err)
			continue
		}
		if ended != nil {
			t.Errorf("%v: serve returned only when its context ended", tc.args)
		}
		for _, want := range []string{tc.flag, "--tls-ca", "--tls-cert", "--tls-key", "--insecure"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: %q does not name %s", tc.args, err, want)
			}
		}
		if _, serr := os.Stat(dataDir); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("%v: refused, but the data dir exists (%v)", tc.args, serr)
		}
		if logs.String() != "" {
			t.Errorf("%v: refused, but logged:\n%s", tc.args, logs.String())
		}
	}
}

// TestServeInsecure: with --insecure, serve listens on every interface
// without TLS; every line it logs says transport=INSECURE, and
// `coordinator status` shows the replica's transport as not protected.
func TestServeInsecure(t *testing.T) {
	const runName = "t-insecure"
	port := strings.TrimPrefix(freeAddrString(t), "127.0.0.1:")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var logs lockedBuffer
	served := make(chan error, 1)
	go func() {
		served <- runServeCmd(ctx, &logs, "--run", runName, "--id", "r1", "--raft-addr", freeAddrString(t),
			"--data-dir", t.TempDir(), "--bootstrap", "--nats-listen", "0.0.0.0:"+port, "--insecure")
	}()
	var st statusReport
	var text string
	for deadline := time.Now().Add(time.Minute); ; {
		sout, _ := run(t, "status", "--nats", "nats://127.0.0.1:"+port, "--run", runName, "--wait", "1200ms", "--json")
		if json.Unmarshal([]byte(sout), &st) == nil && len(st.Replicas) == 1 && st.Replicas[0].Role == "leader" {
			text, _ = run(t, "status", "--nats", "nats://127.0.0.1:"+port, "--run", runName, "--wait", "1200ms")
			break
		}
		select {
		case err := <-served:
			t.Fatalf("serve --insecure returned early: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed r1 leading; last: %s\nlogs:\n%s", sout, logs.String())
		}
	}
	if !st.Replicas[0].Insecure {
		t.Errorf("status %+v does not say the replica runs with --insecure", st.Replicas[0])
	}
	if !strings.Contains(text, "TRANSPORT NOT PROTECTED: replica r1 runs without TLS") {
		t.Errorf("status text does not say the transport is not protected:\n%s", text)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	checkInsecureLogs(t, logs.String(), "embedded NATS server")
}

// checkInsecureLogs checks that the command logged the --insecure warning
// and the line want, and that every line says transport=INSECURE.
func checkInsecureLogs(t *testing.T, logs, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "NOT protected") {
		t.Errorf("the first log line is not the --insecure warning: %s", lines[0])
	}
	if !strings.Contains(logs, want) {
		t.Errorf("no %q line in the logs:\n%s", want, logs)
	}
	for _, l := range lines {
		if !strings.Contains(l, "transport=INSECURE") {
			t.Errorf("a log line does not say transport=INSECURE: %s", l)
		}
	}
}

// TestServeLoopbackNeedsNoTLS: addresses on the loopback interface, by
// IP or as localhost, need neither TLS nor --insecure, and are not
// reported insecure.
func TestServeLoopbackNeedsNoTLS(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "r1")
	port := strings.TrimPrefix(freeAddrString(t), "127.0.0.1:")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var logs lockedBuffer
	served := make(chan error, 1)
	raftAddr := "localhost:" + strings.TrimPrefix(freeAddrString(t), "127.0.0.1:")
	go func() {
		served <- runServeCmd(ctx, &logs, "--id", "r1", "--raft-addr", raftAddr, "--data-dir", dataDir, "--bootstrap",
			"--nats-listen", "127.0.0.1:"+port, "--peers", "r1="+raftAddr+",r2=127.0.0.2:7000,r3=[::1]:7000")
	}()
	for !strings.Contains(logs.String(), "embedded NATS server") {
		select {
		case err := <-served:
			t.Fatalf("serve on loopback addresses: %v\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if strings.Contains(logs.String(), "INSECURE") {
		t.Errorf("a loopback run logs INSECURE:\n%s", logs.String())
	}
}

// TestNodeRefusesOpenAddressWithoutTLS: a node asked to dial a NATS
// server off the loopback interface without TLS exits at once with
// ErrInsecureTransport, before it loads its shard; with --insecure it goes
// on and joins the run, and every line it logs says transport=INSECURE.
func TestNodeRefusesOpenAddressWithoutTLS(t *testing.T) {
	runFile := writeRunFile(t, "run: t-node-insecure")
	unreachable := "nats://10.1.2.3:4222"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var logs lockedBuffer
	err := runNodeCmd(ctx, &logs, "--config", runFile, "--nats", unreachable, "--id", "n0")
	if !errors.Is(err, ErrInsecureTransport) || ctx.Err() != nil {
		t.Fatalf("node dialing %s without TLS: %v (context: %v), want ErrInsecureTransport at once", unreachable, err, ctx.Err())
	}
	for _, want := range []string{"--nats " + unreachable, "--tls-ca", "--tls-cert", "--tls-key", "--insecure"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %s", err, want)
		}
	}
	if logs.String() != "" {
		t.Errorf("refused, but logged:\n%s", logs.String())
	}

	// With --insecure it dials a server off the loopback interface: one
	// listening on every interface, dialed at 0.0.0.0 (which Linux connects
	// to this machine). It joins the run: status sees it.
	scfg := transport.DefaultEmbeddedServerConfig()
	scfg.Host, scfg.Port = "0.0.0.0", -1
	srv, err := transport.StartServer(scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(srv.URL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	open := "nats://0.0.0.0:" + port
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	var ilogs lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- runNodeCmd(ctx, &ilogs, "--config", runFile, "--nats", open, "--id", "n0", "--insecure")
	}()
	for deadline := time.Now().Add(time.Minute); ; {
		sout, _ := run(t, "status", "--nats", "nats://127.0.0.1:"+port, "--run", "t-node-insecure", "--wait", "1200ms", "--json")
		var st statusReport
		if json.Unmarshal([]byte(sout), &st) == nil && len(st.Nodes) == 1 && st.Nodes[0] == "n0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node with --insecure never joined; last status: %s\nlogs:\n%s", sout, ilogs.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("node with --insecure: %v", err)
	}
	checkInsecureLogs(t, ilogs.String(), "shard loaded")
}

// TestNodeLoopbackNeedsNoTLS: a node dialing a loopback NATS URL passes
// the check without TLS or --insecure (it then waits for the server).
func TestNodeLoopbackNeedsNoTLS(t *testing.T) {
	runFile := writeRunFile(t, "run: t-node-loopback")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- runNodeCmd(ctx, &logs, "--config", runFile, "--nats", "nats://"+addr+",localhost:1", "--id", "n0")
	}()
	for deadline := time.Now().Add(nodeTestWait); !strings.Contains(logs.String(), "shard loaded"); {
		if time.Now().After(deadline) {
			t.Fatalf("the node never loaded its shard:\n%s", logs.String())
		}
		select {
		case err := <-done:
			t.Fatalf("node on loopback: %v\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	<-done
	if strings.Contains(logs.String(), "INSECURE") {
		t.Errorf("a loopback node logs INSECURE:\n%s", logs.String())
	}
}

package cli

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/pki"
)

func TestCertsInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	out, _, err := runCmd(t, "certs", "init", "--dir", dir, "--replicas", "r1,r2,r3",
		"--nodes", "node-0,node-1", "--observers", "ops", "--hosts", "10.0.0.1,coord.example", "--days", "30")
	if err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	ids := []string{"ca", "r1", "r2", "r3", "node-0", "node-1", "ops"}
	if got, want := strings.Count(out, "\n"), 2*len(ids); got != want {
		t.Errorf("printed %d lines, want %d:\n%s", got, want, out)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, id := range ids {
		for ext, mode := range map[string]os.FileMode{".crt": 0o644, ".key": 0o600} {
			p := filepath.Join(dir, id+ext)
			if !strings.Contains(out, "wrote "+p+"\n") {
				t.Errorf("output does not name %s:\n%s", p, out)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != mode {
				t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), mode)
			}
		}
		if id == "ca" {
			continue
		}
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, DNSName: "coord.example"}); err != nil {
			t.Errorf("%s: %v", id, err)
		}
		if _, gotID, err := pki.Identity(pair.Leaf); err != nil || gotID != id {
			t.Errorf("%s: Identity %q, %v", id, gotID, err)
		}
	}

	// One more node later: the same CA, only its files.
	out, _, err = runCmd(t, "certs", "init", "--dir", dir, "--nodes", "node-2")
	if err != nil {
		t.Fatalf("adding node-2: %v", err)
	}
	if want := "wrote " + filepath.Join(dir, "node-2.key") + "\nwrote " + filepath.Join(dir, "node-2.crt") + "\n"; out != want {
		t.Errorf("adding node-2 printed %q, want %q", out, want)
	}
	// Again: refused, naming the file.
	_, _, err = runCmd(t, "certs", "init", "--dir", dir, "--nodes", "node-2")
	if err == nil || !strings.Contains(err.Error(), "node-2.") {
		t.Errorf("re-adding node-2: %v, want an error naming its file", err)
	}
}

func TestCertsInitErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no dir", []string{"--replicas", "r1"}, "--dir is required"},
		{"no replicas", []string{"--nodes", "n1"}, "--replicas is required"},
		{"no ids", nil, "no IDs"},
		{"invalid id", []string{"--replicas", "r1", "--nodes", "node 0"}, `--nodes: invalid ID "node 0"`},
		{"empty id", []string{"--replicas", "r1,,r2"}, `--replicas: invalid ID ""`},
		{"ca", []string{"--replicas", "ca"}, `invalid ID "ca"`},
		{"duplicate", []string{"--replicas", "r1", "--nodes", "r1"}, `"r1" given twice`},
		{"days", []string{"--replicas", "r1", "--days", "0"}, "validity of 0 days"},
		{"host", []string{"--replicas", "r1", "--hosts", "a b"}, "invalid host name"},
	} {
		dir := filepath.Join(t.TempDir(), "certs")
		args := []string{"certs", "init"}
		if tc.name != "no dir" {
			args = append(args, "--dir", dir)
		}
		out, _, err := runCmd(t, append(args, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
		if out != "" {
			t.Errorf("%s: printed %q", tc.name, out)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%s: created %s", tc.name, dir)
		}
	}
}

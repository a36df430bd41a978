package cli

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// TestCertsInitBundles: --bundles writes, for every ID issued,
// DIR/hosts/ID/ holding exactly ca.crt, ID.crt and ID.key (folders 0700,
// the key 0600) and never ca.key; the bundle's certificate chains to the
// CA and names the ID's role and ID. A later init adds only the new IDs'
// bundles, and refuses one whose folder exists, writing nothing.
func TestCertsInitBundles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	out, _, err := runCmd(t, "certs", "init", "--dir", dir, "--bundles", "--replicas", "r1,r2",
		"--nodes", "node-0", "--observers", "ops", "--hosts", "10.0.0.1")
	if err != nil {
		t.Fatalf("certs init --bundles: %v\n%s", err, out)
	}
	roles := map[string]pki.Role{"r1": pki.RoleReplica, "r2": pki.RoleReplica, "node-0": pki.RoleNode, "ops": pki.RoleObserver}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	checkBundle := func(id string, role pki.Role) {
		t.Helper()
		b := filepath.Join(dir, "hosts", id)
		ents, err := os.ReadDir(b)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if want := []string{"ca.crt", id + ".crt", id + ".key"}; !slices.Equal(names, want) {
			t.Errorf("%s holds %q, want %q", b, names, want)
		}
		for p, mode := range map[string]os.FileMode{b: 0o700, filepath.Dir(b): 0o700,
			filepath.Join(b, "ca.crt"): 0o644, filepath.Join(b, id+".crt"): 0o644, filepath.Join(b, id+".key"): 0o600} {
			if fi, err := os.Stat(p); err != nil {
				t.Error(err)
			} else if fi.Mode().Perm() != mode {
				t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), mode)
			}
		}
		for _, f := range []string{"ca.crt", id + ".crt", id + ".key"} {
			if !strings.Contains(out, "wrote "+filepath.Join(b, f)+"\n") {
				t.Errorf("output does not name %s:\n%s", filepath.Join(b, f), out)
			}
		}
		if got, _ := os.ReadFile(filepath.Join(b, "ca.crt")); !bytes.Equal(got, ca.CertPEM()) {
			t.Errorf("%s/ca.crt is not the CA's certificate", b)
		}
		pair, err := tls.LoadX509KeyPair(filepath.Join(b, id+".crt"), filepath.Join(b, id+".key"))
		if err != nil {
			t.Fatal(err)
		}
		bundleRoots := x509.NewCertPool()
		if pem, _ := os.ReadFile(filepath.Join(b, "ca.crt")); !bundleRoots.AppendCertsFromPEM(pem) {
			t.Fatalf("%s/ca.crt holds no certificate", b)
		}
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: bundleRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, DNSName: "10.0.0.1"}); err != nil {
			t.Errorf("%s: %v", id, err)
		}
		if gotRole, gotID, err := pki.Identity(pair.Leaf); err != nil || gotRole != role || gotID != id {
			t.Errorf("%s: Identity %s %q, %v; want %s %q", b, gotRole, gotID, err, role, id)
		}
	}
	for id, role := range roles {
		checkBundle(id, role)
	}
	if got, want := strings.Count(out, "\n"), 2*(1+len(roles))+3*len(roles); got != want {
		t.Errorf("printed %d lines, want %d:\n%s", got, want, out)
	}
	noCAKey := func() {
		t.Helper()
		err := filepath.WalkDir(filepath.Join(dir, "hosts"), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Name() == "ca.key" {
				t.Errorf("a bundle holds the CA's key: %s", p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	noCAKey()

	// One more node: the same CA, its files and its bundle only.
	out, _, err = runCmd(t, "certs", "init", "--dir", dir, "--bundles", "--nodes", "node-1", "--hosts", "10.0.0.1")
	if err != nil {
		t.Fatalf("adding node-1: %v", err)
	}
	var want string
	for _, p := range []string{"node-1.key", "node-1.crt", "hosts/node-1/ca.crt", "hosts/node-1/node-1.key", "hosts/node-1/node-1.crt"} {
		want += "wrote " + filepath.Join(dir, p) + "\n"
	}
	if out != want {
		t.Errorf("adding node-1 printed %q, want %q", out, want)
	}
	checkBundle("node-1", pki.RoleNode)
	noCAKey()
	if ents, _ := os.ReadDir(filepath.Join(dir, "hosts")); len(ents) != len(roles)+1 {
		t.Errorf("hosts/ holds %d bundles, want %d", len(ents), len(roles)+1)
	}

	// A bundle folder that exists (the ID's own files do not): refused,
	// naming it, before anything is written.
	if err := os.Mkdir(filepath.Join(dir, "hosts", "node-2"), 0o700); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCmd(t, "certs", "init", "--dir", dir, "--bundles", "--nodes", "node-2")
	if !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), filepath.Join("hosts", "node-2")) || out != "" {
		t.Errorf("node-2 with an existing bundle folder: %v, printed %q; want an error naming the folder", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "node-2.key")); err == nil {
		t.Error("a refused init wrote node-2.key")
	}
}

package pki_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/node"
	"github.com/dpcluster/dpcluster/pki"
)

func newCA(t *testing.T) *pki.KeyPair {
	t.Helper()
	ca, err := pki.NewCA(365)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *pki.KeyPair, role pki.Role, id string) *pki.KeyPair {
	t.Helper()
	p, err := pki.Issue(ca, role, id, []string{"10.0.0.1", "coord-1.example"}, 30)
	if err != nil {
		t.Fatalf("Issue(%s, %s): %v", role, id, err)
	}
	return p
}

func pool(ca *pki.KeyPair) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func TestIssueVerifyIdentity(t *testing.T) {
	ca := newCA(t)
	other := newCA(t)
	for _, tc := range []struct {
		role   pki.Role
		id     string
		server bool // has ServerAuth
	}{
		{pki.RoleReplica, "r1", true},
		{pki.RoleNode, "node-0", false},
		{pki.RoleObserver, "ops", false},
	} {
		t.Run(string(tc.role), func(t *testing.T) {
			leaf := issue(t, ca, tc.role, tc.id)
			verify := func(roots *x509.CertPool, eku x509.ExtKeyUsage) error {
				_, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{eku}, DNSName: "coord-1.example"})
				return err
			}
			if err := verify(pool(ca), x509.ExtKeyUsageClientAuth); err != nil {
				t.Errorf("ClientAuth verify: %v", err)
			}
			if err := verify(pool(ca), x509.ExtKeyUsageServerAuth); (err == nil) != tc.server {
				t.Errorf("ServerAuth verify: %v, want ok %v", err, tc.server)
			}
			if err := verify(pool(other), x509.ExtKeyUsageClientAuth); err == nil {
				t.Error("verified against another CA")
			}
			role, id, err := pki.Identity(leaf.Cert)
			if err != nil || role != tc.role || id != tc.id {
				t.Errorf("Identity = %q, %q, %v; want %q, %q", role, id, err, tc.role, tc.id)
			}
			for _, h := range []string{"localhost", "127.0.0.1", "::1", "10.0.0.1", "coord-1.example"} {
				if err := leaf.Cert.VerifyHostname(h); err != nil {
					t.Errorf("VerifyHostname(%s): %v", h, err)
				}
			}
			if got, want := leaf.Cert.NotAfter.Sub(leaf.Cert.NotBefore), 30*24*time.Hour; got < want || got > want+time.Hour {
				t.Errorf("validity %v, want about %v", got, want)
			}
		})
	}
	if !ca.Cert.IsCA || !ca.Cert.MaxPathLenZero || ca.Cert.MaxPathLen != 0 {
		t.Errorf("CA: IsCA %v, MaxPathLen %d (zero %v)", ca.Cert.IsCA, ca.Cert.MaxPathLen, ca.Cert.MaxPathLenZero)
	}
	if d := ca.Cert.NotAfter.Sub(time.Now()); d < 9*365*24*time.Hour {
		t.Errorf("CA valid for %v, want 10 years", d)
	}
	if ca.Cert.SerialNumber.Cmp(other.Cert.SerialNumber) == 0 {
		t.Error("two CAs with the same serial")
	}
}

func TestIssueRefuses(t *testing.T) {
	ca := newCA(t)
	for _, tc := range []struct {
		name  string
		role  pki.Role
		id    string
		hosts []string
		days  int
		want  error
	}{
		{"bad role", "admin", "a", nil, 1, pki.ErrUnknownRole},
		{"empty id", pki.RoleNode, "", nil, 1, pki.ErrInvalidID},
		{"slash", pki.RoleNode, "a/b", nil, 1, pki.ErrInvalidID},
		{"dot", pki.RoleNode, "a.b", nil, 1, pki.ErrInvalidID},
		{"too long", pki.RoleNode, strings.Repeat("a", 65), nil, 1, pki.ErrInvalidID},
		{"ca", pki.RoleReplica, "ca", nil, 1, pki.ErrInvalidID},
		{"zero days", pki.RoleNode, "n", nil, 0, nil},
		{"outlasts CA", pki.RoleNode, "n", nil, 11 * 365, nil},
		{"empty host", pki.RoleNode, "n", []string{""}, 1, nil},
		{"bad host", pki.RoleNode, "n", []string{"a b"}, 1, nil},
	} {
		_, err := pki.Issue(ca, tc.role, tc.id, tc.hosts, tc.days)
		if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: Issue = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// forge signs a leaf with ca from a hand-made template, for the identity
// checks Issue would never produce.
func forge(t *testing.T, ca *pki.KeyPair, cn string, ou []string, uris ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42),
		Subject:      pkix.Name{CommonName: cn, OrganizationalUnit: ou},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestIdentityRejects(t *testing.T) {
	ca := newCA(t)
	for _, tc := range []struct {
		name string
		cn   string
		ou   []string
		uris []string
		want error
	}{
		{"no URI", "n1", []string{"node"}, nil, pki.ErrNoIdentity},
		{"other scheme only", "n1", []string{"node"}, []string{"spiffe://x/node/n1"}, pki.ErrNoIdentity},
		{"CN mismatch", "n2", []string{"node"}, []string{"dpcluster://node/n1"}, pki.ErrInconsistentIdentity},
		{"OU mismatch", "n1", []string{"replica"}, []string{"dpcluster://node/n1"}, pki.ErrInconsistentIdentity},
		{"two OUs", "n1", []string{"node", "replica"}, []string{"dpcluster://node/n1"}, pki.ErrInconsistentIdentity},
		{"no OU", "n1", nil, []string{"dpcluster://node/n1"}, pki.ErrInconsistentIdentity},
		{"two URIs", "n1", []string{"node"}, []string{"dpcluster://node/n1", "dpcluster://replica/n1"}, pki.ErrInconsistentIdentity},
		{"unknown role", "n1", []string{"admin"}, []string{"dpcluster://admin/n1"}, pki.ErrUnknownRole},
		{"bad id", "n.1", []string{"node"}, []string{"dpcluster://node/n.1"}, pki.ErrInvalidID},
		{"extra path", "n1", []string{"node"}, []string{"dpcluster://node/n1/x"}, pki.ErrInvalidID},
		{"query", "n1", []string{"node"}, []string{"dpcluster://node/n1?a=b"}, pki.ErrInconsistentIdentity},
		{"port", "n1", []string{"node"}, []string{"dpcluster://node:1/n1"}, pki.ErrUnknownRole},
		{"user", "n1", []string{"node"}, []string{"dpcluster://u@node/n1"}, pki.ErrInconsistentIdentity},
	} {
		role, id, err := pki.Identity(forge(t, ca, tc.cn, tc.ou, tc.uris...))
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Identity = %q, %q, %v; want %v", tc.name, role, id, err, tc.want)
		}
	}
	// The forger's happy path, so that the cases above fail for their reason.
	if _, _, err := pki.Identity(forge(t, ca, "n1", []string{"node"}, "dpcluster://node/n1", "spiffe://x/y")); err != nil {
		t.Errorf("well-formed forged cert: %v", err)
	}
}

func TestValidIDAgreesWithNode(t *testing.T) {
	cases := []string{"", "a", "node-0", "r_1", "A-Z_09", strings.Repeat("x", 64), strings.Repeat("x", 65),
		"a.b", "a b", "a/b", "é", "a*", "a>", "\x00", "ca"}
	for c := 0; c < 256; c++ {
		cases = append(cases, "n"+string(rune(c)), string([]byte{byte(c)}))
	}
	for _, id := range cases {
		if got, want := pki.ValidID(id), node.ValidID(id); got != want {
			t.Errorf("pki.ValidID(%q) = %v, node.ValidID = %v", id, got, want)
		}
	}
}

func names() []pki.Name {
	return []pki.Name{
		{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleReplica, ID: "r2"},
		{Role: pki.RoleNode, ID: "node-0"}, {Role: pki.RoleObserver, ID: "ops"},
	}
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestInitFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	written, err := pki.Init(dir, names(), []string{"10.0.0.1"}, 365)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, n := range append([]string{"ca"}, "r1", "r2", "node-0", "ops") {
		want = append(want, filepath.Join(dir, n+".key"), filepath.Join(dir, n+".crt"))
	}
	if !slices.Equal(written, want) {
		t.Fatalf("written %q, want %q", written, want)
	}
	for _, p := range written {
		wantMode := fs.FileMode(0o644)
		if strings.HasSuffix(p, ".key") {
			wantMode = 0o600
		}
		if got := mode(t, p); got != wantMode {
			t.Errorf("%s: mode %v, want %v", p, got, wantMode)
		}
	}
	if got := mode(t, dir); got != 0o700 {
		t.Errorf("dir mode %v, want 0700", got)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != len(want) {
		t.Errorf("%d entries in dir (temporary files left?), want %d", len(ents), len(want))
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	node0 := loadPair(t, dir, "node-0")
	if _, err := node0.Leaf.Verify(x509.VerifyOptions{Roots: pool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("node-0 against the written CA: %v", err)
	}

	// A second init refuses to overwrite, and writes nothing.
	before := readAll(t, dir)
	_, err = pki.Init(dir, names()[2:3], nil, 365)
	if !errors.Is(err, pki.ErrExists) || !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), "node-0.") {
		t.Errorf("second init: %v, want ErrExists naming node-0's file", err)
	}
	if after := readAll(t, dir); !mapsEqual(before, after) {
		t.Error("a refused init changed the directory")
	}

	// Adding a name reuses the CA and writes only that name.
	written, err = pki.Init(dir, []pki.Name{{Role: pki.RoleNode, ID: "node-1"}}, nil, 30)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "node-1.key"), filepath.Join(dir, "node-1.crt")}; !slices.Equal(written, want) {
		t.Errorf("add: written %q, want %q", written, want)
	}
	node1 := loadPair(t, dir, "node-1")
	if _, err := node1.Leaf.Verify(x509.VerifyOptions{Roots: pool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("added node-1 against the first CA: %v", err)
	}
	for p, b := range before {
		if after := readAll(t, dir)[p]; after != b {
			t.Errorf("adding a name changed %s", p)
		}
	}
}

func TestInitRefuses(t *testing.T) {
	dup := []pki.Name{{Role: pki.RoleReplica, ID: "x"}, {Role: pki.RoleNode, ID: "x"}}
	for _, tc := range []struct {
		name  string
		names []pki.Name
		days  int
	}{
		{"duplicate across roles", dup, 1},
		{"invalid id", []pki.Name{{Role: pki.RoleNode, ID: "a b"}}, 1},
		{"ca", []pki.Name{{Role: pki.RoleNode, ID: "ca"}}, 1},
		{"days", names(), 0},
	} {
		dir := filepath.Join(t.TempDir(), "certs")
		if _, err := pki.Init(dir, tc.names, nil, tc.days); err == nil {
			t.Errorf("%s: Init succeeded", tc.name)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: refused Init created %s", tc.name, dir)
		}
	}
	// Half a CA is refused, not replaced.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, pki.CACertFile), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Init(dir, names(), nil, 1); err == nil || !strings.Contains(err.Error(), "CA file") {
		t.Errorf("half a CA: %v", err)
	}
	// A leaf is not a CA.
	dir = t.TempDir()
	if _, err := pki.Init(dir, names(), nil, 1); err != nil {
		t.Fatal(err)
	}
	for _, ext := range []string{".crt", ".key"} {
		b, _ := os.ReadFile(filepath.Join(dir, "r1"+ext))
		os.Remove(filepath.Join(dir, "ca"+ext))
		if err := os.WriteFile(filepath.Join(dir, "ca"+ext), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pki.LoadCA(dir); !errors.Is(err, pki.ErrBadCA) {
		t.Errorf("LoadCA of a leaf: %v, want ErrBadCA", err)
	}
}

func TestWriteFileExclusive(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := pki.WriteFileExclusive(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFileExclusive(p, []byte("two"), 0o600); !errors.Is(err, pki.ErrExists) || !strings.Contains(err.Error(), p) {
		t.Errorf("second write: %v, want ErrExists naming %s", err, p)
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Errorf("file holds %q, want the first write", b)
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Errorf("%d entries, want 1 (temporary file left)", len(ents))
	}
}

func loadPair(t *testing.T, dir, id string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"))
	if err != nil {
		t.Fatalf("load %s: %v", id, err)
	}
	return c
}

func readAll(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// handshake runs a TLS handshake over a loopback connection between a
// server holding the replica's certificate and requiring client
// certificates from ca, and a client presenting client. It returns the
// server's error and, on success, the identity it read from the client.
func handshake(t *testing.T, ca, replica *pki.KeyPair, client tls.Certificate) (pki.Role, string, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		role pki.Role
		id   string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer conn.Close()
		srv := tls.Server(conn, &tls.Config{
			Certificates: []tls.Certificate{replica.TLSCertificate()},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool(ca),
			MinVersion:   tls.VersionTLS13,
		})
		if err := srv.HandshakeContext(ctx); err != nil {
			done <- result{err: err}
			return
		}
		role, id, err := pki.Identity(srv.ConnectionState().PeerCertificates[0])
		done <- result{role, id, err}
	}()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cli := tls.Client(conn, &tls.Config{
		Certificates: []tls.Certificate{client},
		RootCAs:      pool(ca),
		ServerName:   "localhost",
		MinVersion:   tls.VersionTLS13,
	})
	// In TLS 1.3 the client may finish before the server rejects its
	// certificate; a read surfaces the server's alert. The server's
	// result is what the test checks.
	if err := cli.HandshakeContext(ctx); err == nil {
		cli.SetReadDeadline(time.Now().Add(2 * time.Second))
		cli.Read(make([]byte, 1))
	}
	cli.Close()
	r := <-done
	return r.role, r.id, r.err
}

func TestTLSHandshake(t *testing.T) {
	ca := newCA(t)
	replica := issue(t, ca, pki.RoleReplica, "r1")
	node0 := issue(t, ca, pki.RoleNode, "node-0")
	role, id, err := handshake(t, ca, replica, node0.TLSCertificate())
	if err != nil || role != pki.RoleNode || id != "node-0" {
		t.Errorf("node cert from the CA: %q, %q, %v; want node node-0", role, id, err)
	}
	stranger := issue(t, newCA(t), pki.RoleNode, "node-0")
	if _, _, err := handshake(t, ca, replica, stranger.TLSCertificate()); err == nil {
		t.Error("server accepted a node cert from another CA")
	}
}

func FuzzIdentity(f *testing.F) {
	ca, err := pki.NewCA(1)
	if err != nil {
		f.Fatal(err)
	}
	leaf, err := pki.Issue(ca, pki.RoleReplica, "r1", []string{"10.0.0.1"}, 1)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(leaf.Cert.Raw)
	f.Add(ca.Cert.Raw)
	f.Fuzz(func(t *testing.T, der []byte) {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return
		}
		role, id, err := pki.Identity(cert)
		if err == nil && (!role.Valid() || !pki.ValidID(id) || cert.Subject.CommonName != id) {
			t.Errorf("Identity accepted %q, %q", role, id)
		}
	})
}

// An operator's own CA, with an Ed25519 key, issues the missing names.
func TestInitWithOwnEd25519CA(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(7),
		Subject:               pkix.Name{CommonName: "ops CA"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().AddDate(2, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, pki.CACertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, pki.CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	written, err := pki.Init(dir, []pki.Name{{Role: pki.RoleReplica, ID: "r1"}}, nil, 365)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 2 {
		t.Errorf("written %q, want r1's two files", written)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	r1 := loadPair(t, dir, "r1")
	if _, err := r1.Leaf.Verify(x509.VerifyOptions{Roots: pool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("r1 against the Ed25519 CA: %v", err)
	}
	// A leaf may not outlive the CA it comes from.
	if _, err := pki.Init(dir, []pki.Name{{Role: pki.RoleNode, ID: "n1"}}, nil, 3*365); err == nil || !strings.Contains(err.Error(), "outlast the CA") {
		t.Errorf("3-year leaf from a 2-year CA: %v", err)
	}
}

package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// File names of the CA in a certificate directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// MaxDays is the longest validity Issue and NewCA accept, in days.
const MaxDays = 100 * 365

// caMinDays is a new CA's shortest validity: 10 years, or the leaves'
// validity if longer, so that the CA outlives what it issues.
const caMinDays = 10 * 365

// backdate is how far in the past NotBefore is put, for clock skew between
// the machines of a run.
const backdate = 5 * time.Minute

// ErrBadCA is returned (wrapped) by LoadCA when the CA files do not hold a
// CA certificate and its private key.
var ErrBadCA = errors.New("pki: bad CA")

// KeyPair is a certificate and its private key.
type KeyPair struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// CertPEM returns the certificate as a "CERTIFICATE" PEM block.
func (p *KeyPair) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Cert.Raw})
}

// KeyPEM returns the private key as a PKCS#8 "PRIVATE KEY" PEM block.
func (p *KeyPair) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(p.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// TLSCertificate returns p for a tls.Config's Certificates.
func (p *KeyPair) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{p.Cert.Raw}, PrivateKey: p.Key, Leaf: p.Cert}
}

// NewCA returns a new self-signed CA with an ECDSA P-256 key, valid from a
// few minutes ago for max(days, 10 years) days. It may sign leaves only
// (MaxPathLen 0).
func NewCA(days int) (*KeyPair, error) {
	if err := checkDays(days); err != nil {
		return nil, err
	}
	days = max(days, caMinDays)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"dpcluster"}, CommonName: "dpcluster CA"},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.AddDate(0, 0, days),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA certificate: %w", err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

// LoadCA reads DIR/ca.crt and DIR/ca.key. The certificate must be a CA
// allowed to sign certificates, and the key (PKCS#8, or SEC1 "EC PRIVATE
// KEY"; ECDSA or Ed25519) must be its key. Errors wrap ErrBadCA, or the
// file system's error (fs.ErrNotExist for a missing file).
func LoadCA(dir string) (*KeyPair, error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: %s holds no CERTIFICATE PEM block", ErrBadCA, certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadCA, certPath, err)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: %s is not a CA certificate with the certificate-signing key usage", ErrBadCA, certPath)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadCA, keyPath, err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%w: %s is not the key of %s", ErrBadCA, keyPath, certPath)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q, want PRIVATE KEY", block.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	default:
		return nil, fmt.Errorf("%T key, want ECDSA or Ed25519", key)
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, err1 := x509.MarshalPKIXPublicKey(a)
	eb, err2 := x509.MarshalPKIXPublicKey(b)
	return err1 == nil && err2 == nil && bytes.Equal(ea, eb)
}

// Issue returns a certificate signed by ca naming role and id (see the
// package comment), with a new ECDSA P-256 key, valid from a few minutes
// ago for days days, for "localhost", 127.0.0.1, ::1 and hosts (IP
// addresses are put in the IP SANs, other names in the DNS SANs). It
// refuses an invalid role or ID (ErrUnknownRole, ErrInvalidID), days
// outside 1..MaxDays, and a validity that outlasts the CA.
func Issue(ca *KeyPair, role Role, id string, hosts []string, days int) (*KeyPair, error) {
	if !role.Valid() {
		return nil, fmt.Errorf("%w %q (want %s, %s or %s)", ErrUnknownRole, role, RoleReplica, RoleNode, RoleObserver)
	}
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := checkDays(days); err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.AddDate(0, 0, days)
	if notAfter.After(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("pki: a certificate valid for %d days would outlast the CA (valid until %s)", days, ca.Cert.NotAfter.UTC().Format(time.DateOnly))
	}
	dns, ips, err := splitHosts(hosts)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	eku := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if role == RoleReplica {
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization:       []string{"dpcluster"},
			OrganizationalUnit: []string{string(role)},
			CommonName:         id,
		},
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           eku,
		BasicConstraintsValid: true,
		DNSNames:              dns,
		IPAddresses:           ips,
		URIs:                  []*url.URL{IdentityURI(role, id)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: create certificate for %s %s: %w", role, id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse certificate for %s %s: %w", role, id, err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

func checkID(id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w %q: want 1 to 64 characters of [A-Za-z0-9_-]", ErrInvalidID, id)
	}
	if id == "ca" {
		return fmt.Errorf("%w %q: reserved for the CA's files", ErrInvalidID, id)
	}
	return nil
}

func checkDays(days int) error {
	if days < 1 || days > MaxDays {
		return fmt.Errorf("pki: validity of %d days, want 1 to %d", days, MaxDays)
	}
	return nil
}

// splitHosts returns localhost, 127.0.0.1, ::1 and hosts, without
// duplicates, as DNS names and IP addresses.
func splitHosts(hosts []string) (dns []string, ips []net.IP, err error) {
	seen := map[string]bool{}
	for _, h := range append([]string{"localhost", "127.0.0.1", "::1"}, hosts...) {
		if h == "" {
			return nil, nil, errors.New("pki: empty host name")
		}
		if ip := net.ParseIP(h); ip != nil {
			if !seen[ip.String()] {
				seen[ip.String()] = true
				ips = append(ips, ip)
			}
			continue
		}
		if !validHost(h) {
			return nil, nil, fmt.Errorf("pki: invalid host name %q", h)
		}
		if !seen[h] {
			seen[h] = true
			dns = append(dns, h)
		}
	}
	return dns, ips, nil
}

// validHost reports whether h can be a DNS SAN: letters, digits, '-', '.'
// and a leading "*." wildcard, at most 253 bytes.
func validHost(h string) bool {
	if len(h) > 253 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '*' && i == 0 && len(h) > 1 && h[1] == '.') {
			return false
		}
	}
	return true
}

// newSerial returns a random 128-bit serial number.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return n, nil
}

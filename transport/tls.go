package transport

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/dpcluster/dpcluster/pki"
)

// tlsHandshakeTimeout bounds the TLS handshake of a client or route
// connection to an embedded server, in seconds (nats-server's unit).
const tlsHandshakeTimeout = 5

// tlsFiles is a TLSConfig's files, loaded: the CA pool and, if CertFile
// was given, the certificate with the role and ID it names.
type tlsFiles struct {
	roots *x509.CertPool // nil: the system's roots
	cert  *tls.Certificate
	role  pki.Role
	id    string
}

// load reads t's files. A certificate must name a dpcluster identity
// (pki.Identity); otherwise, or if a file cannot be read, the error wraps
// ErrCertificate.
func (t TLSConfig) load() (*tlsFiles, error) {
	f := &tlsFiles{}
	if t.CAFile != "" {
		caPEM, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: CA: %v", ErrCertificate, err)
		}
		f.roots = x509.NewCertPool()
		if !f.roots.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("%w: CA: %s holds no PEM certificate", ErrCertificate, t.CAFile)
		}
	}
	if t.CertFile == "" {
		return f, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %s, %s: %v", ErrCertificate, t.CertFile, t.KeyFile, err)
	}
	if f.role, f.id, err = pki.Identity(cert.Leaf); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCertificate, t.CertFile, err)
	}
	f.cert = &cert
	return f, nil
}

// verifyOwn checks that the certificate chains to the CA, now, for each of
// usages.
func (f *tlsFiles) verifyOwn(usages ...x509.ExtKeyUsage) error {
	inter := x509.NewCertPool()
	for _, der := range f.cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrCertificate, err)
		}
		inter.AddCert(c)
	}
	for _, u := range usages {
		opts := x509.VerifyOptions{Roots: f.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{u}}
		if _, err := f.cert.Leaf.Verify(opts); err != nil {
			return fmt.Errorf("%w: %s %s: %v", ErrCertificate, f.role, f.id, err)
		}
	}
	return nil
}

// requireReplicaPeer is a tls.Config.VerifyConnection that accepts only a
// peer whose certificate (its chain already verified by crypto/tls) names
// a replica: the NATS servers of a run, and their routes, are replicas.
func requireReplicaPeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("transport: peer presented no certificate")
	}
	role, id, err := pki.Identity(cs.PeerCertificates[0])
	if err != nil {
		return err
	}
	if role != pki.RoleReplica {
		return fmt.Errorf("transport: peer is %s %s, not a replica", role, id)
	}
	return nil
}

// clientTLS returns the tls.Config of a client dialing NATS servers: it
// verifies the server's chain against the CA (or the system's roots) and
// host name (ServerName, else the URL's host), presents the client
// certificate if there is one and then also requires the server to hold
// a replica certificate.
func (f *tlsFiles) clientTLS(serverName string) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: f.roots, ServerName: serverName}
	if f.cert != nil {
		c.Certificates = []tls.Certificate{*f.cert}
		c.VerifyConnection = requireReplicaPeer
	}
	return c
}

// selfTLS returns the tls.Config of the in-process client of an embedded
// server started from the same files: it presents the certificate and
// accepts only a server presenting that very certificate (which is this
// process's own server, whatever host name it listens on).
func (f *tlsFiles) selfTLS() *tls.Config {
	own := f.cert.Leaf.Raw
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{*f.cert},
		// The server is authenticated by its certificate, byte for byte,
		// in VerifyConnection, not by host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, own) {
				return errors.New("transport: the embedded server presented another certificate")
			}
			return nil
		},
	}
}

// secureServer configures opts for mutual TLS with certificate-mapped
// users (issue 12):
//
//   - Client connections must be TLS 1.3 and present a certificate that
//     chains to the CA with the ClientAuth usage; a plaintext client, one
//     without a certificate or with another CA's is refused in the
//     handshake (nats-server's TLSVerify).
//   - Each verified certificate is mapped to a NATS user named
//     dpcluster://ROLE/ID whose permissions are Subjects.Permissions for
//     that role and ID, enforced by nats-server; a certificate naming no
//     dpcluster identity is refused (authorization violation).
//   - Routes to and from the other members are mutual TLS with replica
//     certificates of the CA; the dialing side also checks the member's
//     host name.
//
// nats-server's verify_and_map maps a certificate to a user configured in
// advance, one per identity, and its permission templates are for JWT
// users only; a node's ID is not known to the replicas before it connects
// (a node can join a run with a certificate issued later), so the mapping
// is nats-server's CustomClientAuthentication hook, which runs after the
// handshake verified the certificate and registers the user for it.
func (f *tlsFiles) secureServer(opts *server.Options, s Subjects) error {
	if f.cert == nil || f.roots == nil {
		return fmt.Errorf("%w: embedded TLS needs CAFile, CertFile and KeyFile", ErrInvalidConfig)
	}
	if f.role != pki.RoleReplica {
		return fmt.Errorf("%w: the NATS server needs a replica certificate, %s is %s's", ErrCertificate, f.id, f.role)
	}
	if err := f.verifyOwn(x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth); err != nil {
		return err
	}
	opts.TLS, opts.TLSVerify, opts.TLSTimeout = true, true, tlsHandshakeTimeout
	opts.TLSConfig = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{*f.cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    f.roots,
	}
	opts.CustomClientAuthentication = certUsers{s}
	if opts.Cluster.Port != 0 {
		opts.Cluster.TLSTimeout = tlsHandshakeTimeout
		opts.Cluster.TLSConfig = &tls.Config{
			MinVersion:       tls.VersionTLS13,
			Certificates:     []tls.Certificate{*f.cert},
			ClientAuth:       tls.RequireAndVerifyClientCert,
			ClientCAs:        f.roots,
			RootCAs:          f.roots,
			VerifyConnection: requireReplicaPeer,
		}
	}
	return nil
}

// certUsers maps a client's verified certificate to a NATS user with the
// permissions of its role and ID (server.Authentication).
type certUsers struct{ subjects Subjects }

// Check implements server.Authentication. The TLS handshake has already
// verified the chain; Check reads the identity and registers the user.
func (u certUsers) Check(c server.ClientAuthentication) bool {
	cs := c.GetTLSConnectionState()
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return false
	}
	role, id, err := pki.Identity(cs.PeerCertificates[0])
	if err != nil {
		return false
	}
	pub, sub := u.subjects.Permissions(role, id)
	if len(pub) == 0 || len(sub) == 0 {
		return false // an empty allow list would allow everything
	}
	c.RegisterUser(&server.User{
		Username: pki.IdentityURI(role, id).String(),
		Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: pub},
			Subscribe: &server.SubjectPermission{Allow: sub},
		},
	})
	return true
}

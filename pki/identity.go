package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
)

// Role is what a certificate's holder is in a run.
type Role string

// The roles a certificate can name.
const (
	// RoleReplica is a coordinator replica: it serves NATS and Raft and
	// dials its peers.
	RoleReplica Role = "replica"
	// RoleNode is a training worker.
	RoleNode Role = "node"
	// RoleObserver is an operator's tool (coordinator status, dashboards):
	// it may read a run's state but takes no part in it.
	RoleObserver Role = "observer"
)

// URIScheme is the scheme of the URI SAN that names a certificate's role
// and ID: dpcluster://ROLE/ID.
const URIScheme = "dpcluster"

// Errors returned by Identity (wrapped, with the detail).
var (
	// ErrNoIdentity is returned when a certificate has no dpcluster:// URI
	// subject alternative name.
	ErrNoIdentity = errors.New("pki: certificate has no dpcluster:// URI SAN")
	// ErrInconsistentIdentity is returned when a certificate has more than
	// one dpcluster:// URI, a malformed one, or a subject CommonName or
	// OrganizationalUnit that disagrees with it.
	ErrInconsistentIdentity = errors.New("pki: inconsistent certificate identity")
	// ErrUnknownRole is returned for a role other than replica, node and
	// observer.
	ErrUnknownRole = errors.New("pki: unknown role")
	// ErrInvalidID is returned for an ID that is not 1–64 characters of
	// [A-Za-z0-9_-], or that is reserved (ca).
	ErrInvalidID = errors.New("pki: invalid ID")
)

// Valid reports whether r is one of RoleReplica, RoleNode and RoleObserver.
func (r Role) Valid() bool {
	return r == RoleReplica || r == RoleNode || r == RoleObserver
}

// ValidID reports whether id can name a replica, node or observer: 1 to 64
// ASCII letters, digits, '-' or '_'. It is the rule of node.ValidID (and
// transport.ValidRunName), kept here so that transport can import pki
// later without a cycle; a test checks that the two agree.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// IdentityURI returns dpcluster://ROLE/ID, the URI SAN naming role and id.
func IdentityURI(role Role, id string) *url.URL {
	return &url.URL{Scheme: URIScheme, Host: string(role), Path: "/" + id}
}

// Identity returns the role and ID that cert names, after checking that
// its dpcluster:// URI SAN, Subject CommonName and Subject
// OrganizationalUnit agree. It does not verify the certificate's chain:
// call it on a certificate that TLS (or x509.Verify) has verified against
// the run's CA. The errors wrap ErrNoIdentity, ErrInconsistentIdentity,
// ErrUnknownRole or ErrInvalidID.
func Identity(cert *x509.Certificate) (role Role, id string, err error) {
	var u *url.URL
	for _, v := range cert.URIs {
		if v.Scheme != URIScheme {
			continue
		}
		if u != nil {
			return "", "", fmt.Errorf("%w: two URIs %s and %s", ErrInconsistentIdentity, u, v)
		}
		u = v
	}
	if u == nil {
		return "", "", ErrNoIdentity
	}
	role, id = Role(u.Host), u.Path
	if len(id) > 0 && id[0] == '/' {
		id = id[1:]
	}
	if u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawPath != "" ||
		u.String() != IdentityURI(role, id).String() {
		return "", "", fmt.Errorf("%w: malformed URI %q (want %s://ROLE/ID)", ErrInconsistentIdentity, u, URIScheme)
	}
	if !role.Valid() {
		return "", "", fmt.Errorf("%w %q in %s", ErrUnknownRole, role, u)
	}
	if !ValidID(id) {
		return "", "", fmt.Errorf("%w %q in %s", ErrInvalidID, id, u)
	}
	if cert.Subject.CommonName != id {
		return "", "", fmt.Errorf("%w: CommonName %q, URI %s", ErrInconsistentIdentity, cert.Subject.CommonName, u)
	}
	if !slices.Equal(cert.Subject.OrganizationalUnit, []string{string(role)}) {
		return "", "", fmt.Errorf("%w: OrganizationalUnit %q, URI %s", ErrInconsistentIdentity, cert.Subject.OrganizationalUnit, u)
	}
	return role, id, nil
}

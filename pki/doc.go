// Package pki is a training run's public-key infrastructure: one CA, and
// for every coordinator replica, node and observer a certificate that
// names its role and ID. It uses only the standard library.
//
//	names := []pki.Name{{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleNode, ID: "node-0"}}
//	written, err := pki.Init("certs", names, []string{"10.0.0.1"}, 365)
//	// certs/ca.crt, certs/ca.key, certs/r1.crt, certs/r1.key, ...
//
//	// later, authorizing a TLS peer:
//	role, id, err := pki.Identity(state.PeerCertificates[0])
//
// # Identity in a certificate
//
// A certificate issued by this package carries its identity three times,
// in the manner of `cockroach cert` and `consul tls`:
//
//   - a URI subject alternative name dpcluster://ROLE/ID, the canonical
//     place, which Identity reads;
//   - Subject CommonName = ID;
//   - Subject OrganizationalUnit = [ROLE].
//
// ROLE is replica, node or observer; ID is 1–64 characters of
// [A-Za-z0-9_-] (the rule of node.ValidID and transport.ValidRunName).
// Identity refuses a certificate whose three disagree. Replicas' leaf
// certificates have the extended key usages ServerAuth and ClientAuth (they
// listen and dial); nodes' and observers' have ClientAuth only. Every leaf
// is valid for "localhost", 127.0.0.1, ::1 and the hosts given. Keys are
// ECDSA P-256; a CA brought by the operator may also use Ed25519
// (docs/SECURITY.md says what its certificates must contain).
//
// # Files
//
// Init writes DIR/ca.crt and DIR/ca.key, then DIR/ID.crt and DIR/ID.key
// per name: certificates as "CERTIFICATE" PEM (mode 0644), keys as PKCS#8
// "PRIVATE KEY" PEM (mode 0600). Every file is written to a temporary file
// in DIR, fsynced, linked into place only if the name is free, and DIR is
// fsynced: a file is never overwritten and never half-written. If DIR
// already holds ca.crt and ca.key, Init issues the missing names with that
// CA, so that a node can be added to a running deployment.
package pki

package pki_test

import (
	"crypto/x509"
	"fmt"

	"github.com/dpcluster/dpcluster/pki"
)

// A CA issues a node's certificate; a peer that verified it against the CA
// reads the node's role and ID from it.
func Example() {
	ca, err := pki.NewCA(365)
	if err != nil {
		panic(err)
	}
	leaf, err := pki.Issue(ca, pki.RoleNode, "node-0", []string{"10.0.0.5"}, 30)
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	opts := x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if _, err := leaf.Cert.Verify(opts); err != nil {
		panic(err)
	}
	role, id, err := pki.Identity(leaf.Cert)
	fmt.Println(role, id, err)
	fmt.Println(leaf.Cert.URIs[0])
	// Output:
	// node node-0 <nil>
	// dpcluster://node/node-0
}

package cli

import (
	"errors"

	"github.com/spf13/pflag"

	"github.com/dpcluster/dpcluster/transport"
)

// bindTLSFlags adds --tls-ca, --tls-cert and --tls-key (the files of
// `coordinator certs init`) to fs; cert describes the certificate the
// command needs.
func bindTLSFlags(fs *pflag.FlagSet, ca, cert, key *string, what string) {
	fs.StringVar(ca, "tls-ca", "", "mutual TLS: the run's CA certificate (ca.crt of coordinator certs init); with --tls-cert and --tls-key")
	fs.StringVar(cert, "tls-cert", "", "mutual TLS: "+what+" (ID.crt)")
	fs.StringVar(key, "tls-key", "", "mutual TLS: the key of --tls-cert (ID.key)")
}

// tlsFiles returns the files of --tls-ca, --tls-cert and --tls-key: all
// three, or none (the zero TLSConfig: plaintext).
func tlsFiles(ca, cert, key string) (transport.TLSConfig, error) {
	if ca == "" && cert == "" && key == "" {
		return transport.TLSConfig{}, nil
	}
	if ca == "" || cert == "" || key == "" {
		return transport.TLSConfig{}, errors.New("--tls-ca, --tls-cert and --tls-key go together: give all three (mutual TLS) or none")
	}
	return transport.TLSConfig{CAFile: ca, CertFile: cert, KeyFile: key}, nil
}

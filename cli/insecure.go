package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"

	"github.com/spf13/pflag"
)

// ErrInsecureTransport is returned by serve and node when they would listen
// on or dial an address off this machine's loopback interface without TLS
// and without --insecure.
var ErrInsecureTransport = errors.New("cli: transport not protected")

// insecureFlagUsage is the --insecure flag's help, on serve and node.
const insecureFlagUsage = "allow listening on and dialing non-loopback addresses WITHOUT TLS: anyone on the network can read " +
	"the nodes' un-noised sums and command the run (logged as transport=INSECURE and shown by coordinator status)"

// endpoint is an address a command listens on or dials, and the flag that
// gave it.
type endpoint struct {
	flag string
	// addr is host:port, a bare host, or a URL (scheme://[user@]host[:port]),
	// as NATS accepts server URLs: one without a scheme is nats://addr.
	addr string
}

// endpoints returns one endpoint per address, for flag.
func endpoints(flag string, addrs ...string) []endpoint {
	out := make([]endpoint, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, endpoint{flag: flag, addr: strings.TrimSpace(a)})
	}
	return out
}

// checkTransportSecurity is the secure-by-default rule of serve and node,
// the one place it is decided: a process may listen on or dial an address
// that is not loopback only with TLS (tls: --tls-ca, --tls-cert and --tls-key
// all given) or when the operator says so with --insecure. Loopback
// addresses (127.0.0.0/8, ::1, localhost) need neither, so that local runs
// and tests work as they are. --insecure together with TLS is refused, as a
// contradiction. An address that is neither host:port nor a URL is an error
// naming its flag.
//
// It returns nil or an error wrapping ErrInsecureTransport that names the
// offending addresses, the TLS flags and --insecure. It does no I/O.
func checkTransportSecurity(eps []endpoint, tls, insecure bool) error {
	if tls && insecure {
		return errors.New("--insecure and --tls-ca/--tls-cert/--tls-key exclude each other: give the TLS flags (protected) or --insecure (not protected)")
	}
	var open []string
	for _, e := range eps {
		loop, err := loopbackAddr(e.addr)
		if err != nil {
			return fmt.Errorf("%s %q: %w", e.flag, e.addr, err)
		}
		if !loop {
			open = append(open, e.flag+" "+e.addr)
		}
	}
	if len(open) == 0 || tls || insecure {
		return nil
	}
	verb := "are"
	if len(open) == 1 {
		verb = "is"
	}
	return fmt.Errorf("%w: %s %s not loopback (0.0.0.0, :: or an empty host means every interface), and without TLS anyone "+
		"who can reach it reads the nodes' un-noised sums and commands the run; give --tls-ca, --tls-cert and --tls-key "+
		"(coordinator certs init makes them; docs/SECURITY.md), or --insecure to run unprotected on a network you trust",
		ErrInsecureTransport, strings.Join(open, ", "), verb)
}

// guardTransport applies checkTransportSecurity and, with insecure, returns
// log with the attribute transport=INSECURE, so that every line the command
// logs says its transport is not protected, after a warning naming what is
// exposed. Otherwise it returns log unchanged.
func guardTransport(log *slog.Logger, eps []endpoint, tls, insecure bool) (*slog.Logger, error) {
	if err := checkTransportSecurity(eps, tls, insecure); err != nil {
		return log, err
	}
	if !insecure {
		return log, nil
	}
	log = log.With("transport", "INSECURE")
	addrs := make([]string, 0, len(eps))
	for _, e := range eps {
		addrs = append(addrs, e.flag+" "+e.addr)
	}
	log.Warn("--insecure: NO TLS; the run's transport is NOT protected: whoever can reach these addresses can read "+
		"the nodes' un-noised sums, forge rounds and change the Raft membership", "addrs", strings.Join(addrs, ", "))
	return log, nil
}

// tlsFlagsGiven reports whether the command's --tls-ca, --tls-cert and
// --tls-key are all set. A command without these flags has no TLS.
func tlsFlagsGiven(fs *pflag.FlagSet) bool {
	for _, name := range []string{"tls-ca", "tls-cert", "tls-key"} {
		if f := fs.Lookup(name); f == nil || f.Value.String() == "" {
			return false
		}
	}
	return true
}

// loopbackAddr reports whether addr's host is a loopback address: an IP in
// 127.0.0.0/8 or ::1 (IPv4-mapped too, with or without a zone), or the name
// localhost, which RFC 6761 reserves for loopback. Every other name is not
// loopback: no DNS lookup is made, since a name can resolve anywhere. An
// empty host (":4222") means every interface when listening, and is not
// loopback. addr is host:port, a bare host, or a URL with a host.
func loopbackAddr(addr string) (bool, error) {
	host, err := addrHost(addr)
	if err != nil {
		return false, err
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true, nil
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback(), nil
}

// addrHost returns the host of host:port, of a bare host, or of a URL.
func addrHost(addr string) (string, error) {
	if addr == "" {
		return "", errors.New("empty address")
	}
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return "", err
		}
		if u.Host == "" {
			return "", errors.New("no host in the URL")
		}
		return u.Hostname(), nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err == nil {
		return host, nil
	}
	if strings.ContainsAny(addr, ":[]/@ ") {
		return "", errors.New("want host:port or a URL")
	}
	return addr, nil // a bare host name or IPv4 address
}

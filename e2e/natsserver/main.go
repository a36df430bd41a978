// Command natsserver runs a standalone NATS server for the process tests in
// e2e: the same server, with the same limits, that coordinator
// serve embeds when --nats is empty (transport.StartServer), but in its own
// OS process, so that a test can kill the broker independently of the
// coordinator replicas and the nodes.
//
//	natsserver --listen 127.0.0.1:4222
//	natsserver --listen 127.0.0.1:4222 --run RUN --tls-ca ca.crt --tls-cert r1.crt --tls-key r1.key
//
// With the TLS flags (a replica certificate, as coordinator serve's
// embedded server uses) it requires mutual TLS and gives every client
// certificate its role's permissions on run RUN's subjects
// (transport.EmbeddedServerConfig.TLS).
//
// It logs one line, "nats server ready url=nats://...", once it accepts
// connections, and shuts down cleanly on SIGINT or SIGTERM (exit 0).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/dpcluster/dpcluster/transport"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "natsserver:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("natsserver", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:4222", "host:port to accept NATS clients on (port -1: any free port)")
	runName := fs.String("run", "", "with TLS: the run whose subjects the permissions are for")
	var files transport.TLSConfig
	fs.StringVar(&files.CAFile, "tls-ca", "", "mutual TLS: the run's CA certificate")
	fs.StringVar(&files.CertFile, "tls-cert", "", "mutual TLS: a replica certificate for the server")
	fs.StringVar(&files.KeyFile, "tls-key", "", "mutual TLS: its key")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	host, p, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return fmt.Errorf("--listen: bad port %q", p)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := transport.DefaultEmbeddedServerConfig()
	cfg.Host, cfg.Port, cfg.TLS, cfg.Run = host, port, files, *runName
	// Catch the signals before the server accepts clients, so that a
	// SIGTERM sent right after the ready line is never lost.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	srv, err := transport.StartServer(cfg)
	if err != nil {
		return err
	}
	log.Info("nats server ready", "url", srv.URL(), "pid", os.Getpid())
	s := <-sig
	log.Info("nats server shutting down", "signal", s.String())
	srv.Shutdown()
	return nil
}

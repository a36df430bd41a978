package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dpcluster/dpcluster/transport"
)

// newRegistry returns the registry a command exports its metrics from,
// with what every Prometheus target is expected to export beside its own
// series: the Go runtime's (go_*), the process's (process_*) and
// dpcluster_build_info.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo())
	return reg
}

// buildInfo is dpcluster_build_info: always 1, labelled with the module
// version, the VCS revision (and whether the tree was modified) and the Go
// version the binary was built with, from its build information ("" where
// the build recorded none, as in tests).
func buildInfo() prometheus.Collector {
	labels := prometheus.Labels{"version": "", "revision": "", "modified": "", "goversion": runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		labels["version"] = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				labels["revision"] = s.Value
			case "vcs.modified":
				labels["modified"] = s.Value
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dpcluster", Name: "build_info",
		Help:        "The build of this binary (always 1): module version, VCS revision, whether the tree was modified, Go version.",
		ConstLabels: labels})
	g.Set(1)
	return g
}

// metricsShutdownTimeout bounds the graceful shutdown of the metrics server
// (in-flight scrapes) once its context ends.
const metricsShutdownTimeout = 2 * time.Second

// serveMetrics serves g's metrics in the Prometheus text format on
// http://addr/metrics, and dash (if not nil: a coordinator replica's
// dashboard, package coordinator/dashboard) on every other path, until
// ctx ends. It listens before returning, so the
// returned bound address (useful with port 0) already accepts scrapes; a
// listen error is returned at once. The server's goroutines are owned by
// this call and stop when ctx ends: the server shuts down (waiting up to
// 2 s for scrapes in flight), then the serve error, nil after a clean
// shutdown, is sent on done, which is then closed. Callers that must know
// the server stopped receive from done after ctx ends.
// checkMetricsAddr says, before anything loads, whether addr can be
// listened on: a taken port is refused up front rather than after the
// data load. (The port may still be taken in between; serveMetrics then
// reports it.)
func checkMetricsAddr(addr string) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	return ln.Close()
}

func serveMetrics(ctx context.Context, addr string, g prometheus.Gatherer, dash http.Handler, log *slog.Logger) (bound string, done <-chan error, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: slogPromLogger{log}}))
	if dash != nil {
		mux.Handle("/", dash)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	out := make(chan error, 1)
	go func() {
		defer close(out)
		serveErr := make(chan error, 1)
		go func() { serveErr <- srv.Serve(ln) }()
		var err error
		select {
		case err = <-serveErr: // failed on its own
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metricsShutdownTimeout)
			err = srv.Shutdown(sctx)
			cancel()
			if serr := <-serveErr; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
		}
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			log.Warn("metrics server stopped", "err", err)
		}
		out <- err
	}()
	bound = ln.Addr().String()
	if dash != nil {
		log.Info("serving the dashboard and metrics", "dashboard", "http://"+bound+"/", "metrics", "http://"+bound+"/metrics")
	} else {
		log.Info("serving metrics", "url", "http://"+bound+"/metrics")
	}
	return bound, out, nil
}

// slogPromLogger adapts slog to promhttp's error logger.
type slogPromLogger struct{ log *slog.Logger }

func (l slogPromLogger) Println(v ...any) { l.log.Warn("metrics: " + fmt.Sprint(v...)) }

// registerTransport exports conn's counters (transport.Stats), labelled
// with the run: what it and its embedded NATS server refused (frames
// rejected, messages in another node's name, transfers larger than their
// sender may send, refused TLS handshakes and permissions violations),
// and what that server delivered to its clients, in messages and bytes.
func registerTransport(reg prometheus.Registerer, conn *transport.Client, run string) error {
	labels := prometheus.Labels{"run": run}
	for _, c := range []struct {
		name, help string
		value      func(transport.Stats) uint64
	}{
		{"frames_rejected_total", "Frames the transport rejected (malformed, corrupt, wrong run or sender, too large).", func(s transport.Stats) uint64 { return s.DecodeErrors }},
		{"wrong_sender_total", "Messages dropped for naming another node than the subject they came on.", func(s transport.Stats) uint64 { return s.WrongSender }},
		{"too_large_total", "Chunked transfers refused for announcing more than their sender may send.", func(s transport.Stats) uint64 { return s.TooLarge }},
		{"tls_refused_total", "Client TLS handshakes the embedded NATS server refused.", func(s transport.Stats) uint64 { return s.TLSRefused }},
		{"permission_refused_total", "Publishes and subscriptions the embedded NATS server refused by its permissions.", func(s transport.Stats) uint64 { return s.PermissionRefused }},
		{"delivered_messages_total", "Messages the embedded NATS server delivered to its clients (every subscriber's copy; 0 without an embedded server).", func(s transport.Stats) uint64 { return s.DeliveredMsgs }},
		{"delivered_bytes_total", "Bytes the embedded NATS server delivered to its clients: every subscriber's copy of every message as encoded on the wire (0 without an embedded server).", func(s transport.Stats) uint64 { return s.DeliveredBytes }},
	} {
		value := c.value
		f := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "transport", Name: c.name, Help: c.help, ConstLabels: labels,
		}, func() float64 { return float64(value(conn.Stats())) })
		if err := reg.Register(f); err != nil {
			return err
		}
	}
	return nil
}

package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Server is an embedded NATS server running in this process.
type Server struct {
	ns  *server.Server
	log *serverLog
}

// serverLog receives the embedded server's log lines: it counts the
// connections it refuses (a failed TLS handshake, a permissions violation)
// and logs them at warn level, at most one a second each (the rest at
// debug level, counted in the next warning), and everything else at
// debug level (issue 27: they were neither logged nor counted).
type serverLog struct {
	log             *slog.Logger
	tls, perm       atomic.Uint64
	tlsLog, permLog rateLimit
}

func (l *serverLog) Noticef(format string, v ...any) {
	l.log.Debug("nats: " + fmt.Sprintf(format, v...))
}
func (l *serverLog) Debugf(format string, v ...any) {
	l.log.Debug("nats: " + fmt.Sprintf(format, v...))
}
func (l *serverLog) Tracef(format string, v ...any) {}
func (l *serverLog) Warnf(format string, v ...any)  { l.log.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (l *serverLog) Fatalf(format string, v ...any) {
	l.log.Error("nats: " + fmt.Sprintf(format, v...))
}

func (l *serverLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	var count *atomic.Uint64
	var limit *rateLimit
	switch {
	case strings.Contains(msg, "TLS handshake error"):
		count, limit = &l.tls, &l.tlsLog
	case strings.Contains(msg, "Violation"):
		count, limit = &l.perm, &l.permLog
	default:
		l.log.Warn("nats: " + msg)
		return
	}
	count.Add(1)
	if warn, suppressed := limit.allow(time.Now()); warn {
		l.log.Warn("nats: refused: "+msg, "suppressed_before", suppressed)
	} else {
		l.log.Debug("nats: refused: " + msg)
	}
}

// Refused returns how many client connections the server refused in a
// TLS handshake, and how many permissions violations it refused.
func (s *Server) Refused() (tlsHandshakes, permissions uint64) {
	if s.log == nil {
		return 0, 0
	}
	return s.log.tls.Load(), s.log.perm.Load()
}

// Delivered returns how many messages the server has delivered to its
// clients since it started, and their bytes: every subscriber's copy
// counts, each the message's payload (the transport's encoded frame) and
// NATS headers, without the protocol line (the server's own out_msgs and
// out_bytes, as its /varz monitoring endpoint reports them). A message
// published to k subscribers counts k times; routes to other cluster
// members count too.
func (s *Server) Delivered() (msgs, bytes uint64) {
	v, err := s.ns.Varz(nil)
	if err != nil {
		return 0, 0
	}
	return uint64(v.OutMsgs), uint64(v.OutBytes)
}

// StartServer starts an embedded NATS server and waits until it accepts
// connections. With cfg.TLS it requires mutual TLS and maps every client
// certificate to a user with its role's permissions (see EmbeddedServerConfig.TLS);
// a file it cannot use is an error wrapping ErrCertificate. Stop it with
// Shutdown.
func StartServer(cfg EmbeddedServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var files *tlsFiles
	if cfg.TLS.enabled() {
		var err error
		if files, err = cfg.TLS.load(); err != nil {
			return nil, err
		}
	}
	return startServer(cfg, files, cfg.Logger)
}

// startServer starts the server of a validated cfg, secured with files
// (cfg.TLS loaded) if not nil.
func startServer(cfg EmbeddedServerConfig, files *tlsFiles, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := &server.Options{
		Host:       cfg.Host,
		Port:       cfg.Port,
		MaxPayload: cfg.MaxPayload,
		MaxPending: cfg.MaxPending,
		NoSigs:     true,

		ClientAdvertise: cfg.ClientAdvertise,
	}
	if cfg.ClusterPort != 0 {
		opts.Cluster = server.ClusterOpts{Name: cfg.ClusterName, Host: cfg.ClusterHost, Port: cfg.ClusterPort,
			Advertise: cfg.ClusterAdvertise}
		if len(cfg.Routes) > 0 {
			opts.Routes = server.RoutesFromStr(strings.Join(cfg.Routes, ","))
			if len(opts.Routes) != len(cfg.Routes) {
				return nil, fmt.Errorf("%w: embedded Routes %q", ErrInvalidConfig, cfg.Routes)
			}
		}
	}
	if files != nil {
		subjects, err := NewSubjects(cfg.Run)
		if err != nil {
			return nil, err
		}
		if err := files.secureServer(opts, subjects); err != nil {
			return nil, err
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("transport: embedded server: %w", err)
	}
	sl := &serverLog{log: log}
	ns.SetLoggerV2(sl, false, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(cfg.ReadyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("transport: embedded server on %s:%d not ready after %v", cfg.Host, cfg.Port, cfg.ReadyTimeout)
	}
	return &Server{ns: ns, log: sl}, nil
}

// URL returns the server's client URL (nats://host:port, or tls://host:port
// with TLS).
func (s *Server) URL() string { return s.ns.ClientURL() }

// ClusterAddr returns the address the server accepts routes on
// (host:port), or "" if it is not a cluster member.
func (s *Server) ClusterAddr() string {
	if a := s.ns.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

// NumRoutes returns the number of routes to other cluster members.
func (s *Server) NumRoutes() int { return s.ns.NumRoutes() }

// Shutdown stops the server and waits for it to finish.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// Connect returns a Client over NATS. With cfg.URLs empty it first starts an
// embedded server (cfg.Embedded), owned by the Client and shut down by its
// Close; with Embedded.TLS the Client connects to it presenting that
// certificate. The connection attempt is bounded by cfg.ConnectTimeout and
// ctx's deadline. A client certificate sets cfg.Role and cfg.Name (see
// ClientConfig). A nil log discards.
func Connect(ctx context.Context, cfg Config, log *slog.Logger) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	urls := cfg.URLs
	embedded := len(urls) == 0
	files, tlsConf := (*tlsFiles)(nil), (*tls.Config)(nil)
	var err error
	switch {
	case embedded && cfg.Embedded.TLS.enabled():
		if files, err = cfg.Embedded.TLS.load(); err != nil {
			return nil, err
		}
		tlsConf = files.selfTLS()
	case !embedded && cfg.TLS.enabled():
		if files, err = cfg.TLS.load(); err != nil {
			return nil, err
		}
		tlsConf = files.clientTLS(cfg.TLS.ServerName)
	}
	if err := cfg.ClientConfig.adopt(files); err != nil {
		return nil, err
	}
	var srv *Server
	if embedded {
		if cfg.Embedded.Run == "" {
			cfg.Embedded.Run = cfg.Run
		}
		if srv, err = startServer(cfg.Embedded, files, log); err != nil {
			return nil, err
		}
		urls = []string{srv.URL()}
	}
	link, err := dialNATS(ctx, cfg, urls, tlsConf, log)
	if err != nil {
		if srv != nil {
			srv.Shutdown()
		}
		return nil, err
	}
	c, err := NewClient(link, cfg.ClientConfig, log)
	if err != nil {
		_ = link.Close()
		if srv != nil {
			srv.Shutdown()
		}
		return nil, err
	}
	if srv != nil {
		c.server = srv
		c.onClose = append(c.onClose, srv.Shutdown)
	}
	return c, nil
}

// adopt sets c's Role and Name from the client certificate in files, if
// any, and refuses values that disagree with it (ErrCertificate).
func (c *ClientConfig) adopt(files *tlsFiles) error {
	if files == nil || files.cert == nil {
		return nil
	}
	if c.Role != "" && c.Role != files.role {
		return fmt.Errorf("%w: it is %s %s's certificate; a %s certificate is needed", ErrCertificate, files.role, files.id, c.Role)
	}
	if c.Name != "" && c.Name != files.id {
		return fmt.Errorf("%w: it is %s %s's certificate, not %s's", ErrCertificate, files.role, files.id, c.Name)
	}
	c.Role, c.Name = files.role, files.id
	return nil
}

// natsLink is a Link over core NATS.
type natsLink struct {
	nc      *nats.Conn
	pending int
}

func dialNATS(ctx context.Context, cfg Config, urls []string, tlsConf *tls.Config, log *slog.Logger) (*natsLink, error) {
	timeout := cfg.ConnectTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	name := cfg.Name
	if name == "" {
		name = "dpcluster"
	}
	opts := []nats.Option{
		nats.Name(name + "/" + cfg.Run),
		nats.Timeout(timeout),
		nats.MaxReconnects(cfg.MaxReconnects),
		nats.PingInterval(cfg.PingInterval),
		nats.MaxPingsOutstanding(cfg.MaxPingsOutstanding),
		nats.CustomReconnectDelay(backoff(cfg.ReconnectWait, cfg.MaxReconnectWait)),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subject := ""
			if s != nil {
				subject = s.Subject
			}
			log.Warn("transport: nats async error", "subject", subject, "err", err)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				return // our own Close
			}
			log.Warn("transport: disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("transport: reconnected", "url", nc.ConnectedUrlRedacted())
		}),
	}
	if tlsConf != nil {
		opts = append(opts, nats.Secure(tlsConf))
	}
	switch {
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("transport: nkey seed: %w", err)
		}
		opts = append(opts, o)
	case cfg.CredentialsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredentialsFile))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	}
	delay := backoff(cfg.ReconnectWait, cfg.MaxReconnectWait)
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(strings.Join(urls, ","), opts...)
		if err == nil {
			return &natsLink{nc: nc, pending: cfg.PendingBytes}, nil
		}
		if !cfg.RetryConnect || !errors.Is(err, nats.ErrNoServers) {
			return nil, fmt.Errorf("transport: connect: %w", err)
		}
		d := delay(attempt)
		if attempt == 1 || attempt%10 == 0 {
			log.Info("transport: no NATS server answers yet; retrying", "urls", len(urls), "attempt", attempt, "next_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("transport: connect: %w (last attempt: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// backoff returns a reconnect delay doubling from base to limit, plus up to
// 25% jitter so a fleet of nodes does not reconnect in lockstep.
func backoff(base, limit time.Duration) nats.ReconnectDelayHandler {
	return func(attempts int) time.Duration {
		d := base
		for i := 1; i < attempts && d < limit; i++ {
			d *= 2
		}
		d = min(d, limit)
		return d + time.Duration(rand.Int64N(int64(d)/4+1))
	}
}

func (l *natsLink) Publish(subject string, data []byte) error {
	return l.nc.Publish(subject, data)
}

func (l *natsLink) Subscribe(subject string, fn func(string, []byte)) (func() error, error) {
	before := l.nc.LastError()
	sub, err := l.nc.Subscribe(subject, func(m *nats.Msg) { fn(m.Subject, m.Data) })
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, l.pending); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	// Round-trip so the server has registered the subscription before
	// Subscribe returns: a message published afterwards reaches it.
	if err := l.nc.FlushTimeout(10 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	// The server answers a refused SUB with -ERR before the PONG of the
	// flush, and nats.go records it as the connection's last error. (Two
	// subscriptions refused at once may both see the later error; the
	// server refuses them anyway.)
	if err := l.nc.LastError(); err != before && errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), "Subscription to \""+subject+"\"") {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("%w: %v", ErrPermission, err)
	}
	return func() error {
		err := sub.Unsubscribe()
		if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
			return nil
		}
		return err
	}, nil
}

func (l *natsLink) Flush(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	return l.nc.FlushWithContext(ctx)
}

func (l *natsLink) MaxPayload() int { return int(l.nc.MaxPayload()) }

func (l *natsLink) Close() error {
	l.nc.Close()
	return nil
}

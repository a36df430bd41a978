// Package transport carries dpcluster messages over NATS: connection setup
// (or an embedded broker), the subject scheme scoped by run name, the
// versioned msgpack envelope, and chunked transfer of large float32 tensors.
//
// Coordinator and node code depend on the small Conn interface: Publish a
// typed Message (Join, Leave, Heartbeat, NeedParams, RoundStart,
// Contribution, Params, Leader, Status, Control), Subscribe a Topic with a
// Handler, Close. *Client
// implements it over any Link: core NATS (Connect) or the in-memory fake
// with fault injection (package transport/fake). Both pass the conformance
// suite in transport/transporttest.
//
//	cfg := transport.DefaultConfig() // no URLs: embedded server on 127.0.0.1:4222
//	cfg.Run = "mnist-1"
//	conn, err := transport.Connect(ctx, cfg, logger)
//	...
//	sub, err := conn.Subscribe(transport.TopicContributions, func(m transport.Message) {
//		c := m.(transport.Contribution) // owned by the handler
//		...
//	})
//	err = conn.Publish(ctx, transport.Params{Run: "mnist-1", Step: t, Version: v, Values: theta})
//
// # Wire format
//
// Every NATS message is one frame: a msgpack array [version, type, body].
// Tensors are msgpack bin holding little-endian float32. A message larger
// than the server's max payload is cut into chunks, each carrying its
// offset and a CRC32C (Castagnoli) over its header and data, plus the CRC32C
// of the whole message; the receiver reassembles them in any order, drops
// duplicates, rejects corrupt or inconsistent chunks, asks the sender to
// resend missing ones (NACK to the sender's subject, retransmission to the
// receiver's inbox) and frees a transfer still incomplete after
// ClientConfig.TransferTimeout. docs/PROTOCOL.md is the full specification.
//
// # Security
//
// With TLS files (EmbeddedServerConfig.TLS, Config.TLS: the run's CA and a
// certificate from package pki) an embedded server requires mutual TLS,
// maps each client certificate to a NATS user named by its identity
// (dpcluster://ROLE/ID) whose permissions follow its role
// (Subjects.Permissions), and routes only to replicas; a client presents
// its certificate, takes its role and ID from it (its client ID,
// ROLE.ID.NONCE, is its address in the NACK and inbox subjects) and
// accepts only a replica's server. docs/SECURITY.md says what is checked.
//
// # Errors
//
// Frames that fail to decode never reach a Handler: they are counted in
// Stats and passed to ClientConfig.OnError, wrapping ErrUnknownVersion,
// ErrUnknownType, ErrTruncated, ErrCorrupt, ErrTooLarge, ErrWrongRun or
// ErrIncomplete. Errors never carry message values (sums and counts are
// private).
//
// # Concurrency
//
// A Client is safe for concurrent use. Each Subscription runs its handler
// on its own goroutine, one message at a time; Close stops and waits for
// every goroutine the Client started (and its embedded server, if any).
package transport

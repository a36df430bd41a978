// Package transport carries dpcluster messages over NATS: connection setup
// (or an embedded broker), the subject scheme scoped by run name, the
// versioned msgpack envelope, and chunked transfer of large float32 tensors.
package transport

package transport

import "errors"

// Errors returned by the codec, the chunked transfer and the Client. Decoding
// errors wrap exactly one of ErrUnknownVersion, ErrUnknownType, ErrTruncated,
// ErrCorrupt or ErrTooLarge, so callers can count them with errors.Is.
var (
	// ErrUnknownVersion is returned when a frame's envelope carries a format
	// version this build does not know. The frame is dropped.
	ErrUnknownVersion = errors.New("transport: unknown envelope version")
	// ErrUnknownType is returned when a frame's envelope carries a message
	// type this build does not know, or when a message of the wrong kind is
	// published on a topic.
	ErrUnknownType = errors.New("transport: unknown message type")
	// ErrTruncated is returned when a frame, message or tensor ends before
	// its declared length.
	ErrTruncated = errors.New("transport: truncated message")
	// ErrCorrupt is returned for bytes that are not a well-formed frame:
	// bad msgpack, wrong field types, trailing bytes, a chunk whose CRC32C
	// does not match, a chunk inconsistent with the rest of its transfer, or
	// a reassembled message whose whole-message CRC32C does not match.
	ErrCorrupt = errors.New("transport: corrupt message")
	// ErrTooLarge is returned when a message or an announced transfer is
	// larger than ClientConfig.MaxMessageBytes, or when accepting a transfer
	// would exceed ClientConfig.MaxReassemblyBytes.
	ErrTooLarge = errors.New("transport: message too large")
	// ErrDuplicateChunk is returned by the reassembler for a chunk it already
	// holds. Duplicates are harmless (retransmissions can race) and are
	// counted, not reported through OnError.
	ErrDuplicateChunk = errors.New("transport: duplicate chunk")
	// ErrIncomplete is reported through OnError when a chunked transfer
	// misses chunks after ClientConfig.TransferTimeout; its memory is freed.
	ErrIncomplete = errors.New("transport: incomplete transfer timed out")
	// ErrWrongRun is returned when a message names a run other than the
	// Client's.
	ErrWrongRun = errors.New("transport: message for another run")
	// ErrWrongSender is reported through OnError when a Join, Leave,
	// Heartbeat, NeedParams or Contribution names another node (Sender)
	// than the one whose subject it arrived on (Subjects.Node); the
	// message is dropped. Publish returns it for such a message whose node
	// ID is not a valid subject token.
	ErrWrongSender = errors.New("transport: message names another node than its subject")
	// ErrClosed is returned by operations on a closed Client or Subscription.
	ErrClosed = errors.New("transport: closed")
	// ErrInvalidConfig is wrapped by Config.Validate and ClientConfig.Validate.
	ErrInvalidConfig = errors.New("transport: invalid config")
	// ErrCertificate is returned by Connect and StartServer when a TLS
	// file cannot be used: unreadable, a certificate that names no
	// dpcluster identity (pki.Identity), one whose role or ID disagrees
	// with ClientConfig.Role or Name, or a server certificate that is not
	// a replica certificate chaining to the CA.
	ErrCertificate = errors.New("transport: unusable TLS certificate")
	// ErrPermission is returned by Subscribe when the NATS server refuses
	// the subscription: the client's certificate does not allow it
	// (Subjects.Permissions).
	ErrPermission = errors.New("transport: permission denied")
)

package transport

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/internal/f32le"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/seed"
)

func samples() []Message {
	v := Vector{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, math.MaxFloat32, -1.5, float32(math.Inf(1)), math.Float32frombits(0x7fc00001)}
	return []Message{
		Join{Run: "r", NodeID: "n", ShardSize: 60000, ModelHash: "h"},
		Join{Run: "r", NodeID: "n", ShardSize: 20000, ModelHash: "h", ShardIndex: 2, ShardCount: 3, ShardSeed: math.MaxUint64, SeedPolicy: seed.Seeded},
		Leave{Run: "r", NodeID: "n", Reason: "bye"},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 1, ModelHash: "h", Step: 9},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 1, ModelHash: "h", Step: 9, ShardIndex: 0, ShardCount: 1, ShardSeed: 1, SeedPolicy: seed.Crypto},
		Join{Run: "r", NodeID: "n", ShardSize: 700, ModelHash: "h", SeedPolicy: seed.Crypto, DataSchema: "shape [20], 3 classes", Weights: strings.Repeat("0f", 32), Incarnation: "9b2f0c4e7a11d3a8"},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 700, ModelHash: "h", Step: 2, SeedPolicy: seed.Crypto, DataSchema: "shape [20], 3 classes", Weights: strings.Repeat("0f", 32), Incarnation: "9b2f0c4e7a11d3a8"},
		Join{Run: "r", NodeID: "n", ShardSize: 700, ModelHash: "h", SeedPolicy: seed.Crypto, DataSchema: "shape [20], 3 classes", Incarnation: "9b2f0c4e7a11d3a8", DataHash: strings.Repeat("ab", 32)},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 700, ModelHash: "h", Step: 2, SeedPolicy: seed.Crypto, Incarnation: "9b2f0c4e7a11d3a8", DataHash: strings.Repeat("ab", 32)},
		RoundStart{Run: "r", Step: 3, RoundID: math.MaxUint64, Term: 2, Leader: "l", ParamsVersion: 2, Deadline: -5, SampleRate: 0.01, ClipNorm: 1},
		RoundStart{Run: "r", Step: 3, RoundID: 1, Term: 2, Leader: "l", ParamsVersion: 2, Deadline: 5, SampleRate: 1.0 / 3, ClipNorm: 0.1, ModelHash: "h"},
		RoundStart{Run: "r", Step: 3, Params: v},
		Contribution{Run: "r", Step: 3, RoundID: 4, NodeID: "n", Count: -1, Sum: v},
		Params{Run: "r", Step: 3, Version: 3, Term: 1, Values: v},
		Leader{Run: "r", ReplicaID: "x", Term: 1, Step: 2},
		Status{Run: "r", From: "x", Node: "n", Step: 1, Code: StatusStopped, Detail: "budget"},
		Control{Run: "r", From: "x", Step: 4, Code: ControlReplica, Term: 2, Role: "leader", Nodes: 2, Blocked: "shard_overlap: n0 and n1"},
		Control{Run: "r", From: "x", Code: ControlReplica, Role: "leader", Nodes: 1, Waiting: "waiting for nodes: 1 of 2, missing b"},
		Control{Run: "r", From: "x", Code: ControlReplica, Role: "leader", Nodes: 2, Standing: "not waited for: b (missed at step 3)"},
		Control{Run: "r", From: "r4", Code: ControlJoin, Addr: "10.0.0.4:7000"},
		Control{Run: "r", From: "r1", Code: ControlRemove, Replica: "r2"},
		NeedParams{Run: "r", NodeID: "n", Version: 7},
		Leave{Run: "r", NodeID: "n", Reason: "bye", Incarnation: "9b2f0c4e7a11d3a8"},
	}
}

// TestOptionalFields: the fields added in envelope version 1 round-trip,
// and a body without them (an older sender) decodes with zero values,
// which the receivers treat as "not given".
func TestOptionalFields(t *testing.T) {
	for _, m := range []Message{
		Join{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", ShardIndex: 2, ShardCount: 3, ShardSeed: 5, SeedPolicy: seed.Seeded},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", Step: 4, ShardIndex: 1, ShardCount: 3, ShardSeed: 5, SeedPolicy: seed.Crypto},
		Join{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", ShardCount: 1, SeedPolicy: seed.Crypto, DataSchema: "shape [2]", Weights: strings.Repeat("0f", 32)},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", Step: 4, ShardCount: 1, SeedPolicy: seed.Crypto, DataSchema: "shape [2]", Weights: strings.Repeat("0f", 32)},
		Join{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", ShardCount: 1, SeedPolicy: seed.Crypto, Incarnation: "s1"},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", Step: 4, ShardCount: 1, SeedPolicy: seed.Crypto, Incarnation: "s1"},
		Leave{Run: "r", NodeID: "n", Reason: "bye", Incarnation: "s1"},
		Join{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", ShardCount: 1, SeedPolicy: seed.Crypto, DataHash: strings.Repeat("ab", 32)},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 7, ModelHash: "h", Step: 4, ShardCount: 1, SeedPolicy: seed.Crypto, DataHash: strings.Repeat("ab", 32)},
		RoundStart{Run: "r", Step: 1, SampleRate: 0.25, ClipNorm: 1, ModelHash: "h"},
		Control{Run: "r", From: "x", Code: ControlReplica, Insecure: true, Step: 4, Charged: 5},
	} {
		b, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%v: decoded %+v, %v; want %+v", m.Type(), got, err, m)
		}
	}
	old := func(typ Type, body map[string]any) Message {
		t.Helper()
		var buf bytes.Buffer
		if err := msgpack.NewEncoder(&buf).Encode(body); err != nil {
			t.Fatal(err)
		}
		m, err := DecodeAs(typ, buf.Bytes())
		if err != nil {
			t.Fatalf("%v without the optional fields: %v", typ, err)
		}
		return m
	}
	if j := old(TypeJoin, map[string]any{"run": "r", "node": "n", "shard": 7, "model": "h"}).(Join); j.ShardCount != 0 || j.SeedPolicy != "" || j.ShardSize != 7 || j.DataSchema != "" || j.Weights != "" || j.Incarnation != "" || j.DataHash != "" {
		t.Errorf("old Join decoded as %+v", j)
	}
	if h := old(TypeHeartbeat, map[string]any{"run": "r", "node": "n", "shard": 7, "model": "h", "step": 3}).(Heartbeat); h.ShardCount != 0 || h.SeedPolicy != "" || h.Step != 3 || h.DataSchema != "" || h.Weights != "" || h.Incarnation != "" || h.DataHash != "" {
		t.Errorf("old Heartbeat decoded as %+v", h)
	}
	if l := old(TypeLeave, map[string]any{"run": "r", "node": "n", "reason": "bye"}).(Leave); l.Incarnation != "" || l.Reason != "bye" {
		t.Errorf("old Leave decoded as %+v", l)
	}
	if c := old(TypeControl, map[string]any{"run": "r", "from": "x", "code": uint8(ControlReplica), "step": 4}).(Control); c.Insecure || c.Charged != 0 || c.Step != 4 {
		t.Errorf("a Control report without insecure decoded as %+v", c)
	}
	if rs := old(TypeRoundStart, map[string]any{"run": "r", "step": 2, "q": 0.5, "clip": 1.0}).(RoundStart); rs.ModelHash != "" || rs.SampleRate != 0.5 {
		t.Errorf("old RoundStart decoded as %+v", rs)
	}
}

// TestOptionalKeys: Join and Heartbeat carry a node's pretrained weights
// hash under the key "weights" and its training data's content hash under
// "data_hash", and Join, Heartbeat and Leave the node process's incarnation
// under "incarnation" (docs/PROTOCOL.md); an empty value
// sends no key, so a node with no checkpoint, or without incarnations, sends
// the messages of a node that predates the field.
func TestOptionalKeys(t *testing.T) {
	hash := strings.Repeat("0f", 32)
	for _, tc := range []struct {
		m    Message
		key  string
		want any // the body's value under key; nil: no such key
	}{
		{Join{Run: "r", NodeID: "n", Weights: hash}, "weights", hash},
		{Heartbeat{Run: "r", NodeID: "n", Weights: hash}, "weights", hash},
		{Join{Run: "r", NodeID: "n"}, "weights", nil},
		{Heartbeat{Run: "r", NodeID: "n"}, "weights", nil},
		{Join{Run: "r", NodeID: "n", Incarnation: "s1"}, "incarnation", "s1"},
		{Heartbeat{Run: "r", NodeID: "n", Incarnation: "s1"}, "incarnation", "s1"},
		{Leave{Run: "r", NodeID: "n", Incarnation: "s1"}, "incarnation", "s1"},
		{Join{Run: "r", NodeID: "n"}, "incarnation", nil},
		{Heartbeat{Run: "r", NodeID: "n"}, "incarnation", nil},
		{Leave{Run: "r", NodeID: "n"}, "incarnation", nil},
		{Join{Run: "r", NodeID: "n", DataHash: hash}, "data_hash", hash},
		{Heartbeat{Run: "r", NodeID: "n", DataHash: hash}, "data_hash", hash},
		{Join{Run: "r", NodeID: "n"}, "data_hash", nil},
		{Heartbeat{Run: "r", NodeID: "n"}, "data_hash", nil},
	} {
		b, err := Encode(tc.m)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		if err := msgpack.Unmarshal(b[3:], &body); err != nil { // the body after the 3-byte envelope header
			t.Fatal(err)
		}
		got, ok := body[tc.key]
		if tc.want == nil && ok || tc.want != nil && got != tc.want {
			t.Errorf("%v: body %v, want %s %v", tc.m.Type(), body, tc.key, tc.want)
		}
	}
}

func TestValidWeights(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"", true},
		{strings.Repeat("0f", 32), true},
		{"0123456789abcdef" + strings.Repeat("0", 48), true},
		{strings.Repeat("0F", 32), false}, // upper case: the same hash as another string
		{strings.Repeat("0f", 31), false},
		{strings.Repeat("0f", 32) + "0", false},
		{strings.Repeat("0g", 32), false},
		{"sha256:" + strings.Repeat("0f", 32), false},
	} {
		if got := ValidWeights(tc.s); got != tc.want {
			t.Errorf("ValidWeights(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, m := range samples() {
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode(%v): %v", m.Type(), err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%v): %v", m.Type(), err)
		}
		// Compare encodings: NaN payloads make DeepEqual unusable, and
		// equal bytes mean equal bits.
		b2, err := Encode(got)
		if err != nil || !bytes.Equal(b2, b) {
			t.Errorf("%v: re-encoding differs (%v)", m.Type(), err)
		}
		if got.Type() != m.Type() || reflect.TypeOf(got) != reflect.TypeOf(m) {
			t.Errorf("decoded %T, want %T", got, m)
		}
	}
}

func TestVectorWireFormat(t *testing.T) {
	for _, run := range []string{"r", "ru", "run", "runs", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"} {
		b, err := Encode(Params{Run: run, Values: Vector{1, -2}})
		if err != nil {
			t.Fatal(err)
		}
		// bin8 of 1+pad+8 bytes: the pad byte, pad zeros, then 1.0 and
		// -2.0 little-endian at an offset that is a multiple of 4.
		floats := []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0}
		i := bytes.Index(b, floats)
		if i < 0 || i%4 != 0 || i+len(floats) != len(b) {
			t.Fatalf("run %q: floats at %d in %x", run, i, b)
		}
		ok := false
		for pad := 0; pad <= 3 && !ok; pad++ {
			ok = b[i-1-pad] == byte(pad) && countZeros(b[i-pad:i]) == pad && b[i-3-pad] == 0xc4 && int(b[i-2-pad]) == 1+pad+8
		}
		if !ok {
			t.Errorf("run %q: bad tensor header in %x", run, b)
		}
	}
	// Decoding a frame the client owns aliases it: no copy.
	b, _ := Encode(Params{Run: "r", Values: make(Vector, 1000)})
	m, err := decode(b, true)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := f32le.View(m.(Params).Values); ok && &v[0] != &b[len(b)-4000] {
		t.Error("owned decode copied the tensor")
	}
	m, _ = decode(b, false)
	if v, ok := f32le.View(m.(Params).Values); ok && &v[0] == &b[len(b)-4000] {
		t.Error("Decode aliases the caller's bytes")
	}
}

// countZeros counts the zero bytes at the end of b.
func countZeros(b []byte) int {
	n := 0
	for n < len(b) && b[len(b)-1-n] == 0 {
		n++
	}
	return n
}

// contributionBody encodes a Contribution body whose sum is the raw bin
// sum.
func contributionBody(t *testing.T, sum []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	if err := e.Encode(map[string]any{"run": "r", "sum": sum}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestTensorDecodeErrors(t *testing.T) {
	cases := []struct {
		name string
		sum  []byte
		want error
	}{
		{"pad too large", []byte{4, 0, 0, 0, 0, 0, 0, 0, 0}, ErrCorrupt},
		{"not whole floats", []byte{0, 1, 2, 3, 4, 5}, ErrCorrupt},
		{"pad longer than bin", []byte{3, 0}, ErrCorrupt},
		{"nonzero padding", []byte{2, 0, 1, 0, 0, 0x80, 0x3f}, ErrCorrupt},
	}
	for _, tc := range cases {
		if _, err := DecodeAs(TypeContribution, contributionBody(t, tc.sum)); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	m, err := DecodeAs(TypeContribution, contributionBody(t, []byte{1, 0, 0, 0, 0x80, 0x3f}))
	if err != nil || len(m.(Contribution).Sum) != 1 || m.(Contribution).Sum[0] != 1 {
		t.Errorf("valid padded tensor: %v, %v", m, err)
	}
	m, err = DecodeAs(TypeContribution, contributionBody(t, []byte{2, 0, 0}))
	if err != nil || m.(Contribution).Sum == nil || len(m.(Contribution).Sum) != 0 {
		t.Errorf("padding only: %v, %v", m, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	good, err := Encode(Contribution{Run: "r", NodeID: "n", Count: 1, Sum: Vector{1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	// Replace the sum (bin8 of 1+pad+12 bytes) by a bin32 declaring 2 GiB.
	binStart := bytes.LastIndex(good, []byte{0xc4})
	hugeBin := append(append([]byte(nil), good[:binStart]...), 0xc6, 0x7f, 0xff, 0xff, 0xfc, 0, 2, 3, 4)
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"not an array", []byte{0x01}, ErrCorrupt},
		{"short envelope", []byte{0x92, 0x01, 0x01}, ErrCorrupt},
		{"version 0", append([]byte{0x93, 0x00}, good[2:]...), ErrUnknownVersion},
		{"version 2", append([]byte{0x93, 0x02}, good[2:]...), ErrUnknownVersion},
		{"type 0", append([]byte{0x93, 0x01, 0x00}, good[3:]...), ErrUnknownType},
		{"type 300", append([]byte{0x93, 0x01, 0xcd, 0x01, 0x2c}, good[3:]...), ErrUnknownType},
		{"chunk via Decode", append([]byte{0x93, 0x01, 0x10}, good[3:]...), ErrUnknownType},
		{"truncated", good[:len(good)-1], ErrTruncated},
		{"trailing", append(append([]byte(nil), good...), 0xc0), ErrCorrupt},
		{"wrong field type", append([]byte{0x93, 0x01, 0x01}, 0x81, 0xa3, 'r', 'u', 'n', 0xc3), ErrCorrupt},
		{"tensor longer than frame", hugeBin, ErrTruncated},
	}
	for _, tc := range cases {
		m, err := Decode(tc.data)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Decode = %v, %v; want %v", tc.name, m, err, tc.want)
		}
	}
	// Every strict prefix fails cleanly.
	for i := range good {
		if _, err := Decode(good[:i]); !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
			t.Errorf("prefix %d: %v", i, err)
		}
	}
}

func TestEncodeRejectsForeignTypes(t *testing.T) {
	for _, m := range []Message{nil, &Join{Run: "r"}} {
		if _, err := Encode(m); !errors.Is(err, ErrUnknownType) {
			t.Errorf("Encode(%T): %v, want ErrUnknownType", m, err)
		}
	}
}

func TestSubjects(t *testing.T) {
	s, err := NewSubjects("run-1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Topic(TopicContributions), "dpc.run-1.contrib"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	snd, rcv := ClientID(pki.RoleReplica, "r1", "0123456789abcdef"), ClientID(pki.RoleNode, "node-0", "fedcba9876543210")
	if got, want := s.Nack(snd, rcv), "dpc.run-1.nack.replica.r1.0123456789abcdef.node.node-0.fedcba9876543210"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, ok := s.nackReceiver(snd, s.Nack(snd, rcv)); !ok || got != rcv {
		t.Errorf("nackReceiver = %q, %v; want %q", got, ok, rcv)
	}
	if got, want := s.Inbox(rcv), "dpc.run-1.inbox.node.node-0.fedcba9876543210"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	for _, id := range []string{snd, rcv, ClientID(anonymous, anonymous, "0000000000000000"),
		ClientID(pki.RoleObserver, strings.Repeat("x", 64), "0123456789abcdef")} {
		if !validClientID(id) {
			t.Errorf("validClientID(%q) = false", id)
		}
	}
	for _, id := range []string{"", "r1", "replica.r1", "replica.r1.0123456789abcde", "replica.r1.0123456789ABCDEF",
		"admin.r1.0123456789abcdef", "replica.r.1.0123456789abcdef", "replica..0123456789abcdef",
		"replica.r1.0123456789abcdef.x", ClientID(pki.RoleNode, strings.Repeat("x", 65), "0123456789abcdef")} {
		if validClientID(id) {
			t.Errorf("validClientID(%q) = true", id)
		}
	}
	for _, bad := range []string{"", "a.b", "a*", "a>", "a b", string(make([]byte, 65))} {
		if _, err := NewSubjects(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewSubjects(%q): %v", bad, err)
		}
	}
	for typ := TypeJoin; typ <= TypeNeedParams; typ++ {
		if !typ.Topic().valid() {
			t.Errorf("%v has no topic", typ)
		}
	}
}

package transport

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

func samples() []Message {
	v := Vector{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, math.MaxFloat32, -1.5, float32(math.Inf(1)), math.Float32frombits(0x7fc00001)}
	return []Message{
		Join{Run: "r", NodeID: "n", ShardSize: 60000, ModelHash: "h"},
		Leave{Run: "r", NodeID: "n", Reason: "bye"},
		Heartbeat{Run: "r", NodeID: "n", ShardSize: 1, ModelHash: "h", Step: 9},
		RoundStart{Run: "r", Step: 3, RoundID: math.MaxUint64, Term: 2, Leader: "l", ParamsVersion: 2, Deadline: -5, SampleRate: 0.01, ClipNorm: 1},
		RoundStart{Run: "r", Step: 3, Params: v},
		Contribution{Run: "r", Step: 3, RoundID: 4, NodeID: "n", Count: -1, Sum: v},
		Params{Run: "r", Step: 3, Version: 3, Term: 1, Values: v},
		Leader{Run: "r", ReplicaID: "x", Term: 1, Step: 2},
		Status{Run: "r", From: "x", Node: "n", Step: 1, Code: StatusStopped, Detail: "budget"},
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
	b, err := Encode(Params{Run: "r", Values: Vector{1, -2}})
	if err != nil {
		t.Fatal(err)
	}
	// The tensor is a bin8 of 8 bytes: little-endian 1.0 and -2.0.
	want := []byte{0xc4, 8, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0}
	if !bytes.Contains(b, want) {
		t.Errorf("encoding %x does not contain %x", b, want)
	}
}

func TestDecodeErrors(t *testing.T) {
	good, err := Encode(Contribution{Run: "r", NodeID: "n", Count: 1, Sum: Vector{1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	oddBin := bytes.Replace(good, []byte{0xc4, 12}, []byte{0xc4, 11}, 1)
	oddBin = oddBin[:len(oddBin)-1]
	// Replace the 14-byte sum (bin8 of 12) by a bin32 declaring 2 GiB.
	hugeBin := append(append([]byte(nil), good[:len(good)-14]...), 0xc6, 0x7f, 0xff, 0xff, 0xfc, 1, 2, 3, 4)
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
		{"tensor not whole floats", oddBin, ErrCorrupt},
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
	if got, want := s.Nack("abc"), "dpc.run-1.nack.abc"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	for _, bad := range []string{"", "a.b", "a*", "a>", "a b", string(make([]byte, 65))} {
		if _, err := NewSubjects(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewSubjects(%q): %v", bad, err)
		}
	}
	for typ := TypeJoin; typ <= TypeStatus; typ++ {
		if !typ.Topic().valid() {
			t.Errorf("%v has no topic", typ)
		}
	}
}

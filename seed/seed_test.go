package seed

import (
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		in          string
		want        Policy
		wantErr     bool
		wantPrivate bool
	}{
		{"crypto", Crypto, false, true},
		{"seeded", Seeded, false, false},
		{"", "", true, false},
		{"Crypto", "", true, false},
		{"random", "", true, false},
	} {
		got, err := ParsePolicy(tc.in)
		if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, ErrUnknown)) {
			t.Errorf("ParsePolicy(%q): err = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err == nil && (got != tc.want || got.Private() != tc.wantPrivate) {
			t.Errorf("ParsePolicy(%q) = %q (private %v), want %q (%v)", tc.in, got, got.Private(), tc.want, tc.wantPrivate)
		}
	}
}

// TestPolicyWire: a Policy encodes as the msgpack string it holds, byte for
// byte, so messages written before the type existed decode unchanged.
func TestPolicyWire(t *testing.T) {
	for _, p := range []Policy{Crypto, Seeded} {
		got, err := msgpack.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		want, err := msgpack.Marshal(string(p))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%q encodes as %x, want %x", p, got, want)
		}
		var back Policy
		if err := msgpack.Unmarshal(want, &back); err != nil || back != p {
			t.Errorf("decoding %x: %q, %v", want, back, err)
		}
	}
}

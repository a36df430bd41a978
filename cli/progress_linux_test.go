package cli

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProgressAutoOnATerminal: --progress auto shows the bar on a
// terminal (a pseudo-terminal here), also through stderr's lockedWriter,
// and not on a character device that is not one (/dev/null).
func TestProgressAutoOnATerminal(t *testing.T) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	defer ptmx.Close()
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pts.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	for _, tc := range []struct {
		name string
		w    any
		bar  bool
	}{
		{"terminal", pts, true},
		{"terminal behind stderr's lock", &lockedWriter{w: pts}, true},
		{"/dev/null", null, false},
		{"/dev/null behind stderr's lock", &lockedWriter{w: null}, false},
	} {
		p, err := newProgress(tc.w.(interface{ Write([]byte) (int, error) }), "auto", nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.bar != tc.bar {
			t.Errorf("%s: bar %v, want %v", tc.name, p.bar, tc.bar)
		}
	}
}

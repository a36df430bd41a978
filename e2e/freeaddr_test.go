package e2e

import "testing"

// TestFreeAddrNeverRepeats: FreeAddr hands out each port once per test
// binary. Before, it returned any port free at the moment, so 1000 picks
// from its 12 000 repeated about 40 times, and a test's 30-40 picks
// repeated one a few times in a hundred runs: two of its processes then
// raced to bind it (TestProcessNetworkSoak failed CI: "bind: address
// already in use").
func TestFreeAddrNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		a := FreeAddr(t)
		if seen[a] {
			t.Fatalf("FreeAddr handed out %s twice", a)
		}
		seen[a] = true
	}
}

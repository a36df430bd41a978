package raftlog

import "testing"

// TestHeld: a directory without a log, or with a closed one, is not held;
// one a Store has open is, and Held leaves it so (the store appends after
// it, and a second Open still fails).
func TestHeld(t *testing.T) {
	dir := t.TempDir()
	if held, err := Held(dir); err != nil || held {
		t.Fatalf("no log: held %v, %v", held, err)
	}
	s := openTestLogStore(t, dir)
	for range 2 {
		if held, err := Held(dir); err != nil || !held {
			t.Fatalf("open store: held %v, %v", held, err)
		}
	}
	if err := s.StoreLogs(testLogs(1, 3, 1)); err != nil {
		t.Fatalf("append after Held: %v", err)
	}
	if err := InUse(dir); err == nil {
		t.Fatal("the lock was released by Held")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if held, err := Held(dir); err != nil || held {
		t.Fatalf("closed store: held %v, %v", held, err)
	}
}

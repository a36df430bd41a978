package raftlog_test

import (
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/raftlog"
)

// A replica's log: entries appended with one fsync, read back, the head
// compacted after a snapshot; the log is in use while the store is open,
// and the store reopens where it was.
func Example() {
	dir, err := os.MkdirTemp("", "raftlog")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	s, err := raftlog.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	var entries []*raft.Log
	for i := uint64(1); i <= 5; i++ {
		entries = append(entries, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("step %d", i))})
	}
	if err := s.StoreLogs(entries); err != nil {
		log.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		log.Fatal(err)
	}
	var e raft.Log
	if err := s.GetLog(3, &e); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("entry 3: %q\n", e.Data)

	if err := s.DeleteRange(1, 2); err != nil { // compaction after a snapshot at 2
		log.Fatal(err)
	}
	fmt.Println("in use:", errors.Is(raftlog.InUse(dir), raftlog.ErrInUse)) // Open would wait, then fail
	s.Close()
	fmt.Println("in use after Close:", raftlog.InUse(dir) != nil)

	s, err = raftlog.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	term, _ := s.GetUint64([]byte("CurrentTerm"))
	fmt.Printf("reopened: entries %d..%d, term %d\n", first, last, term)
	// Output:
	// entry 3: "step 3"
	// in use: true
	// in use after Close: false
	// reopened: entries 3..5, term 1
}

package raftnet_test

import (
	"fmt"
	"log"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/raftnet"
)

// Two stream layers on loopback: one dials the other, whose watch reports
// the end of the inbound connection; once the listener is closed its
// address refuses connections, the proof the coordinator's leader watch
// needs that a process is gone.
func Example() {
	a, err := raftnet.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	w := raftnet.Watch(a)
	b, err := raftnet.Listen("127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	accepted := make(chan error, 1)
	go func() {
		c, err := w.Accept()
		if err == nil {
			c.Read(make([]byte, 1)) // blocks until the dialer hangs up
			c.Close()
		}
		accepted <- err
	}()
	c, err := b.Dial(raft.ServerAddress(a.Addr().String()), time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("refused while listening:", raftnet.Refused(a.Addr().String(), time.Second))
	c.Close()
	if err := <-accepted; err != nil {
		log.Fatal(err)
	}
	select {
	case <-w.Ended():
		fmt.Println("inbound connection ended")
	case <-time.After(5 * time.Second):
		fmt.Println("no end reported")
	}
	addr := a.Addr().String()
	a.Close()
	fmt.Println("refused once closed:", raftnet.Refused(addr, time.Second))
	// Output:
	// refused while listening: false
	// inbound connection ended
	// refused once closed: true
}

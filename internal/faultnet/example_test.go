package faultnet_test

import (
	"fmt"
	"io"
	"net"

	"github.com/dpcluster/dpcluster/internal/faultnet"
)

func Example() {
	// A server that says hello to each connection.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()

	p, _ := faultnet.Listen("127.0.0.1:0", ln.Addr().String())
	defer p.Close()
	read := func() string {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return "connection reset"
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		if err != nil {
			return "connection reset"
		}
		return fmt.Sprintf("%q", b)
	}
	fmt.Println(read())
	p.Cut()
	fmt.Println(read())
	p.Heal()
	fmt.Println(read())
	// Output:
	// "hello"
	// connection reset
	// "hello"
}

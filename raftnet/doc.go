// Package raftnet is the replicas' Raft transport: a TCP stream layer that
// advertises its address exactly as configured (Stream), and mutual TLS on
// it (TLSStream, issue 12): replicas accept connections only from, and
// dial only, holders of a replica certificate of the run's CA, with the
// handshake done off Raft's goroutines and bounded in time. The
// coordinator package builds hashicorp/raft's network transport on it.
package raftnet

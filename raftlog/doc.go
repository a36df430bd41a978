// Package raftlog is a replica's durable Raft log and stable store
// (hashicorp/raft's LogStore, StableStore and MonotonicLogStore): entries
// in append-only segment files, each with its own CRC32C, one write and
// one fsync per append; the stable keys replaced atomically; a lock so two
// processes never append to one log; and a read-only view for a process
// that reads a running replica's log (coordinator's export). Store's doc
// comment has the format and the crash cases. The coordinator package
// opens it under DataDir/raft.
package raftlog

// Package node is the worker side of a dpcluster training run: it holds a
// private data shard, Poisson-samples it each round, computes the sum of
// per-example gradients clipped to L2 norm C, and sends that sum and the
// batch count to the coordinator's leader. A node never sees another node's
// data and never adds noise; the leader does that once for the whole round.
//
//	cfg := node.DefaultConfig()
//	cfg.ID, cfg.Run = "node-3", "mnist-1"
//	cfg.SampleRate, cfg.ClipNorm = rc.SampleRate, rc.Optimizer.ClipNorm // the run's q and C
//	cfg.ShardIndex, cfg.ShardCount, cfg.ShardSeed = 3, 4, 1             // shard 3 of 4
//	conn, err := transport.Connect(ctx, tcfg, log) // tcfg.URLs: the NATS servers
//	w, err := node.NewWorker(cfg, m, shard, conn, log)
//	err = w.Run(ctx) // until the run ends (nil) or ctx is cancelled
//	conn.Close()
//
// # Round protocol (node side)
//
// All messages are those of package transport, on the run's subjects
// (docs/PROTOCOL.md).
//
//  1. Leaders. The coordinator's leader publishes Leader{ReplicaID, Term}
//     when it gains leadership and every second. The node follows the
//     highest term seen (also learnt from a RoundStart's Term and Leader)
//     and ignores RoundStart and Params of a lower term, and Status from a
//     replica known only as a lower term's leader.
//  2. Registration. The node publishes Join{NodeID, ShardSize, ModelHash,
//     ShardIndex, ShardCount, ShardSeed, SeedPolicy, DataSchema, Weights}
//     when Run starts and again whenever it follows a new leader, a
//     Heartbeat (the same fields and the last step it contributed to)
//     every Config.HeartbeatEvery throughout, and Leave when Run returns.
//     SeedPolicy is seed.Seeded with Config.SeededSampling, else
//     seed.Crypto; the leader of a private run refuses a seeded node, the
//     leader refuses a node whose Weights (Config.Weights) are not the
//     run's pretrained weights, and it opens no round while two live
//     nodes claim the same shard.
//  3. Parameters. The leader publishes Params{Version, Term, Values} after
//     each committed step (Version = number of committed steps; 0 is θ₀)
//     and when it gains leadership. The node validates them (length,
//     finite values) and keeps the few highest versions.
//  4. Rounds. RoundStart{Step, RoundID, Term, ParamsVersion, Deadline,
//     SampleRate q, ClipNorm C, ModelHash} opens a round. The node answers
//     each (Step, RoundID) at most once — a new RoundID for the same step
//     (a new leader reopening it) is a new round — and never after
//     Deadline. It checks q ∈ (0, 1], C ∈ [model.MinClipNorm,
//     model.MaxClipNorm] (model.CheckClipNorm) and a deadline (else
//     SkipInvalid), and that q, C and the model hash are exactly the run's
//     (Config.SampleRate, Config.ClipNorm, the model's hash; else
//     SkipParamsMismatch, logged at warn). A refused round changes nothing:
//     in particular its Term and Leader are not followed.
//  5. Answer. With Params of version ParamsVersion, the node draws a
//     Poisson sample of its shard (each example independently with
//     probability q, from a fresh crypto/rand-keyed sampler), computes
//     S = Σ clip_C(∇ℓᵢ) and the count with its engine's ClippedSumIndexed
//     (model.Engine; any batch size, in chunks of EngineBatch), and publishes
//     Contribution{Step, RoundID, Count, Sum}. An example whose gradient is
//     not finite adds zero and is counted; whether one was sampled changes
//     nothing else the node does or shows. Without those Params it
//     waits Config.ParamsGrace, then publishes NeedParams{Version:
//     ParamsVersion} every Config.ParamsRetry
//     until the Params arrive (then answers) or the deadline passes (then
//     skips). A newer round supersedes a round still waiting.
//  6. Verdicts. Status{StatusRejected, Node: this node} is logged at warn;
//     with Detail "model_hash" the coordinator runs another model and Run
//     returns ErrModelMismatch; with "seed_policy" or "shard_identity",
//     or "data_schema: " or "pretrained_weights: " and the run's schema or
//     weights hash, the leader refuses this node and Run returns
//     ErrRefused (logged at error). "seat_taken: " (another live process
//     holds this node's ID: Join, Heartbeat and Leave carry an incarnation
//     drawn at start, which tells the processes apart) is logged once at
//     error and the node keeps heartbeating: a process restarted after
//     one that died without leaving gets the seat when the old one's
//     lapses. "unknown_node"
//     (the leader leaves this node out of its rounds) is warned once,
//     then logged at debug. Status StatusDone or StatusStopped
//     ends the run: Run publishes Leave and returns nil.
//  7. Faults. A restarted node starts over (Join, wait for a round, ask for
//     Params). A coordinator failover appears as a higher Leader term or as
//     silence; the node keeps heartbeating and the transport reconnects.
//
// # Privacy
//
// A contribution's Sum and Count are un-noised private data: the node never
// logs, exports (Stats, metrics) or persists them, nor which examples were
// sampled; error messages about a computation are reduced to a class. Only
// the number of rounds answered or skipped, timings and step and version
// numbers are observable. Sampling randomness is cryptographically secure
// unless Config.SeededSampling is set, which is for tests, is logged as not
// private and is reported to the leader in Join and Heartbeat.
//
// # Devices
//
// By default a node computes on the CPU (a model.Workspace on the model's
// back end). Config.Device selects another model.Device, such as a CUDA GPU
// in a binary built with -tags cuda (docs/GPU.md):
//
//	dev, err := model.OpenDevice("cuda:0")
//	defer dev.Close() // after Run returns
//	cfg.Device = dev
//	w, err := node.NewWorker(cfg, m, shard, conn, log)
//
// NewWorker allocates the engine for EngineBatch(cfg, shard.Len(), m.ExampleBytes())
// examples, so a device without kernels for a layer
// (model.ErrUnsupportedLayer) or without the memory fails there (ErrEngine),
// never in a round. Run releases the engine when it returns; Close releases
// it for a Worker that never runs. The device is reported in the "node:
// start" log record and in the dpcluster_node_device_info and
// dpcluster_node_device_memory_bytes metrics. Every engine gives the same
// clipping guarantee; results differ between devices only by rounding.
//
// # Concurrency
//
// Transport handlers (one goroutine per subscription) only forward messages
// on channels; a single loop goroutine (the one calling Run) owns all
// protocol state and computes gradients; one more goroutine sends
// heartbeats. Both stop before Run returns. The compute engine is used only
// by the loop goroutine.
package node

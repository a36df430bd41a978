// Package ledger is the durable privacy ledger every coordinator replica
// keeps, and the budgets that read it. The privacy math it charges with is
// package accounting; ledger decides what is charged, when, and whether the
// budget allows it, and makes each charge durable before it counts.
//
//  1. A Ledger is one run's hash-chained, append-only File (file.go):
//     length-prefixed, CRC'd records, fsynced per append, a torn tail
//     repaired on open. Record 1 is the run record (Start): run, target ε,
//     δ, noise source, mechanism, accountant (AccountantRDP or
//     AccountantPLD) and the Raft history it binds the ledger to.
//  2. Each Charge records one step's accounting.Event with its Raft
//     position and the ε spent after it, if the run's accountant keeps ε
//     within the target; otherwise it returns ErrBudgetExceeded and records
//     nothing. WouldExceed asks the same question without recording.
//  3. The ε recorded is a deterministic function of the charges in file
//     order (budget.go): the RDP accountant composes them one by one; a
//     PLD ledger records the PLD accountant's ε at a sparse count grid
//     (at most PLDGridRatio above the ε of exactly the charges taken) and
//     refuses a charge past the accountant's step limit. Audit and Replay
//     recompute every recorded ε from the records alone, bit for bit.
//  4. End records, once, how the run ended: why, and the last step it
//     applied. Audit takes the applied steps from it and counts a step
//     charged after that step (charged ahead of a g̃ that never came) as
//     charged and never applied; its ε counts. After it, Charge takes
//     replay charges only (ErrRunEnded). Without one, the ledger alone
//     cannot say whether its last step was applied (Unconfirmed), nor
//     whether records were cut from its end: Contents.Audit takes a
//     replay of the data dir's Raft state (RaftReplay, raftcheck.go) and
//     requires the ledger to hold every record it wrote.
//  5. NewTimeline reads a ledger's charges as a timeline of ε with its Raft
//     terms and replays marked (timeline.go).
//  6. A DatasetBudget (dataset.go) is a dataset's lifetime budget across
//     runs: each run reserves its step limit on admission and settles what
//     it charged, composed by the PLD accountant. The admission (an
//     Admission, admission.go) is stated in the run's own run record, so a
//     run is told from another by its admission, not its name or path,
//     and a lost budget can be found and rebuilt from its runs' ledgers.
//
// A Ledger is owned by one goroutine (the coordinator's state machine);
// only its warming of the next PLD grid count runs on a goroutine of its
// own, which Close stops.
package ledger

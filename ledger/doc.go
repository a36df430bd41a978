// Package ledger does dpcluster's privacy accounting: the event model that
// records which mechanism ran and how often, the Rényi-DP accountant for the
// Poisson-subsampled Gaussian and discrete Gaussian mechanisms with its
// conversion to (ε, δ), and
// noise calibration. The durable, hash-chained ledger file every coordinator
// replica keeps lives here too.
package ledger

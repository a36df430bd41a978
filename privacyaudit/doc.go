// Package privacyaudit is the statistics of the one-run privacy audit of
// Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training
// Run" (NeurIPS 2023, arXiv 2305.08846): pure math, no I/O.
package privacyaudit

// Package benchload runs a benchmark's operations from several workers at
// once and reports their rate and p99 latency: the shape of every
// "N concurrent writers" benchmark of the replicated store and log. It is
// for benchmarks only.
package benchload

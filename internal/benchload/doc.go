// Package benchload runs a benchmark's operations from several workers at
// once (Run: a closed loop, the shape of every "N concurrent writers"
// benchmark of the replicated store and log) or at a fixed rate of
// independent arrivals (RunOpen), and reports their rate and latency. It
// is for benchmarks only.
package benchload

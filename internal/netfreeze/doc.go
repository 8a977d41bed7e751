// Package netfreeze is a TCP proxy for tests that can freeze: it keeps
// every connection open and stops forwarding, as a process stopped with
// SIGSTOP, or a host that hangs, looks to its peers — no reset, no close,
// no answer. Tests use it where they cannot stop a process of their own
// (an in-process gateway replica) to show what its clients do.
package netfreeze

// Package loadgen drives Access.Connect against a running gateway the way a
// fleet of GPU nodes would: every node has its own X.509-SVID (minted by the
// dev trust domain's CA) and its own mTLS connection. Setup registers, as the
// admin and the tenant's scheduler, a target, a subsystem with M namespaces,
// the nodes' host bindings and jobs scoping them; Run keeps C connects in
// flight for a duration, Storm connects all N nodes at once. Every result
// records the acknowledged grants, and Verify checks that each one is in the
// audit log: an acknowledged grant without an entry would break the
// gateway's central promise (no grant without a durable audit entry).
//
// It reports exact latency percentiles (all samples kept and sorted): at
// the rates reachable on one machine a run holds at most a few million.
package loadgen

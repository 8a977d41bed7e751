// Package forward carries the writes of a gateway replica that does not
// lead to the one that does, over gRPC with mutual TLS between the
// replicas' SVIDs (DESIGN §12: one ordered log, sequenced by the term's
// leader).
//
// Two calls: a store write as data (store.DB.Apply), and an audit append
// (audit.Log.AppendEncoded). A Client finds the leader through a resolver
// (the election's value: the leader's peer address), and retries a call
// whose answer it lost, or that reached a replica that no longer leads,
// with the same bytes: the request ID inside makes the leader answer a
// retry as it answered the first, not apply it twice.
//
// The service is hand-described (no generated code): one method per kind,
// each a wrapperspb.BytesValue each way. The answer carries the callee's
// outcome as data (an nvmegate error code and message, or "not the
// leader"), so the follower returns the same error its own store would
// have: gRPC statuses are kept for transport failures.
package forward

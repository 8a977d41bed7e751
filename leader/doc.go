// Package leader elects the one gateway replica that runs the background
// work a deployment must do once — the expiry sweep, target
// reconciliation, scheduled rotations and re-encryptions, checkpoints,
// compliance attestations, the store's compaction — on etcd
// (concurrency.Election over a session lease).
//
// A leader keeps leading while its session's lease is kept alive. When
// the session ends (the process died, was paused past the lease's TTL, or
// lost etcd), the context of its work ends and another replica wins the
// election. A paused former leader may wake and write before it notices:
// every write it makes carries its Fence, a compare that the election key
// it won is still there at the revision it was created at, so etcd refuses
// those writes (store proposals and audit appends by their
// compare-and-swap) once any other replica could be leader.
package leader

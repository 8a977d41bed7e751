// Package lease is the grant lifecycle in one place: it issues grants
// (leases that let one host reach one subsystem for one job), renews,
// releases, revokes and expires them, and ends a finished job's grants.
// The rules a grant obeys — its expiry, the credential settings its
// decision's obligations ask for, the host entry it shares with the
// node's other grants on a target — are the root package's
// (nvmegate.Grant); the order in which a step records, stores, programs
// and compensates is this package's.
//
// # The pipeline
//
// Every step runs through one routine (run, pipeline.go):
//
//  1. record: the step's audit entries are durable before anything
//     changes. A grant or renewal whose entry cannot be written changes
//     nothing (ErrUnrecorded). An ended grant is recorded too: an expired
//     one is not ended unrecorded (the next sweep retries it), a revoked
//     one is ended all the same (ending access is the safe direction).
//  2. store: one commit. The node's grants sharing a new grant's host
//     entry on the target (one host NQN, one key scope: the target holds
//     one set of credentials for them) move to its root version and
//     authentication in it, and the node's earlier grant on the subsystem
//     in the job ends, released and superseded by the new one
//     (Grant.SupersededBy): no answer can find both active. An end stores
//     its grants ended and pending removal (Grant.RemovalPending).
//  3. program: the target is told of the host entries that changed and
//     answers once it holds them; only then is a grant returned. An end's
//     grants are settled (no longer pending) once their target
//     acknowledged; those of a target that did not follow stay pending,
//     the caller of a release or revoke is told so (EUNAVAILABLE), and
//     Settle retries them.
//  4. compensate: if the target does not take a grant or renewal, the
//     grants that moved are put back, the grant is ended (or a renewal
//     keeps its old keys) and the grant it superseded is put back in the
//     same commit — unless another's revocation or the job's end came in
//     between — the target follows the store back, and the failure is
//     recorded (a deny entry). An end is never undone; a revocation then
//     rotates the roots its hosts knew.
//
// The entries are built from typed values in one place (entry.go): the
// call's nvmegate.Scope and nvmegate.Decision, the grant, the versions and
// fingerprints of what was issued — never the secrets (audit/doc.go has
// the entry schema).
//
// # Who calls it
//
// The gateway's Access service (Connect → Issue, Renew, Release, Revoke,
// ListGrants), its Jobs service (Finish → EndJob) and the daemon's
// sweeper (Expire). The gateway checks what belongs to the call — policy's
// decision, that a node renews or releases its own grant — and converts
// proto to domain types and back; it records the calls it audits for
// every RPC (a release, the revocation asked for, a job's finish) before
// the lease runs. The daemon runs Expire and Settle on timers.
//
// A Lifecycle needs the grant store and the inventory (*store.DB), the key
// manager (*keys.Manager), the audit log (*audit.Log) and the target agent
// (*targetagent.Agent), each through a small interface of this package:
//
//	l, err := lease.New(lease.Config{Grants: db, Inventory: db, Keys: km, Audit: log, Targets: agent})
//	is, err := l.Issue(ctx, lease.Request{Scope: sc, Decision: d, TTL: time.Hour})
//	// is.Grant is stored, recorded and on the target; is.Credentials go to the node only.
//
// The targets are named by nvmegate.HostRef rather than a type of the
// agent's package, so that the lifecycle does not import the agent (which
// speaks the gateway's generated protocol to remote agents).
package lease

// Package gateway is nvmegate's gRPC front: it registers every service of
// the API (proto/nvmegate/v1) plus health and reflection on one grpc.Server,
// and is the only package where generated proto types meet the domain types
// of the root package.
//
// Every call passes one interceptor chain (interceptors.go): panics become
// Internal; metrics and a log line per call (never bodies, which can carry
// secrets); domain errors become gRPC statuses in one place (status.go);
// requests are validated before anything else sees them (validate.go:
// InvalidArgument naming the field); and policy decides through authz with
// the caller's SPIFFE ID from the mTLS handshake and a description of the
// records the request names (describe.go). Handlers therefore only see
// valid, authorized requests.
//
// The audit log (audit.go) hears of every refused call — malformed ones from
// the validate interceptor and describe, denied ones from the authz
// interceptor — and of every state-changing call from the innermost
// interceptor, before the change: no change without a durable entry. The
// Audit service reads the log for auditors.
//
// Grants are the lease package's: the Access handlers (access.go) take the
// typed scope describe read for the call and policy's decision, hand them
// to lease.Lifecycle (Connect → Issue, Renew, Release, Revoke), and
// convert its grants and credentials to the answer; Jobs.Finish ends the
// job's grants through it (EndJob), and SweepExpired delegates to it. The
// lease records each grant, renewal, revocation and expiry itself, before
// the store or a target changes.
//
// A host NQN belongs to one identity at a time: a node's bound NQN, or for
// an unbound node the NQN derived from its SPIFFE ID (describe.go refuses
// the default if a binding gave it to another node). Inventory.AddHostBinding
// is refused (FailedPrecondition) for an NQN another identity's active
// grants use, until they are revoked, and a grant whose NQN was bound to
// another identity after its call was described is refused at its commit;
// both checks are the store's, in its write transaction. NQNs are compared
// canonically (nvmegate.CanonicalNQN), and a binding must be written so.
//
// What a server serves is wired explicitly in Config: Jobs for the Jobs
// and Access services, Lease for grants, Keys for the Keys service,
// Targets and TargetHub for the target agents. New refuses a Lease
// without Jobs or Targets.
//
// Services whose issues have not landed are registered with the generated
// Unimplemented servers, so they answer Unimplemented after validation and
// policy: never a fake success.
//
// Usage:
//
//	lc, err := lease.New(lease.Config{Grants: db, Inventory: db, Keys: km, Audit: log, Targets: agent})
//	srv, err := gateway.New(gateway.Config{Credentials: creds, Store: db, Jobs: db, Lease: lc, Keys: km,
//		Targets: agent, Audit: log, Authorizer: engine})
//	go srv.Serve(ctx, listener) // returns after ctx ends and a graceful stop
package gateway

// Package authz turns an authenticated gRPC call into a policy decision: it
// maps the caller's SPIFFE ID to a Caller (ParseCaller), builds the one
// input document of the request (Input), evaluates the Rego policy of
// package policy in-process with OPA (Engine), and enforces the decision in
// gRPC server interceptors (UnaryServerInterceptor, StreamServerInterceptor).
//
// # Wiring
//
//	eng, err := authz.NewEngine(ctx, authz.Options{TrustDomain: td, Logger: log})
//	srv := grpc.NewServer(
//		grpc.Creds(grpccredentials.MTLSServerCredentials(source, source, tlsconfig.AuthorizeMemberOf(td))),
//		grpc.ChainUnaryInterceptor(authz.UnaryServerInterceptor(eng, describe, log)),
//		grpc.ChainStreamInterceptor(authz.StreamServerInterceptor(eng, describe, log)),
//	)
//
// Handlers read authz.CallerFromContext and authz.DecisionFromContext; the
// decision's obligations (max TTL, TLS, auth mode, ...) are theirs to
// enforce, and its ID and PolicyRevision go to the audit entry.
//
// # Input document (input in Rego)
//
//	{
//	  "caller": {
//	    "id":           "spiffe://example.org/tenant/acme/scheduler/slurm",
//	    "trust_domain": "example.org",
//	    "role":         "scheduler",  // admin|auditor|node|target|scheduler|gateway|unknown
//	    "tenant":       "acme",       // schedulers only, else ""
//	    "name":         "slurm"       // last segment of a known convention, else ""
//	  },
//	  "rpc": {
//	    "service":     "nvmegate.v1.Inventory",
//	    "method":      "AddTarget",
//	    "full_method": "/nvmegate.v1.Inventory/AddTarget"
//	  },
//	  "action":   "inventory.add_target",  // DescribeFunc's, else derived from the method
//	  "resource": {...},                   // the stored records involved; {} if none
//	  "time":     "2026-10-01T12:00:00Z",  // RFC 3339 (UTC, nanoseconds when present)
//	  "gateway":  {"trust_domain": "example.org"}  // the evaluating gateway's own trust domain
//	}
//
// Every field is always present (strings may be empty). The caller's roles
// follow the SPIFFE ID conventions of DESIGN §3, parsed in Go so that every
// policy sees the same fields; what a role may do is decided in Rego only.
// input.gateway carries the gateway's trust domain so that policy can refuse
// callers of foreign trust domains (defence in depth: mTLS already does).
//
// The action is what the default policy authorizes: roles list actions
// ("access.connect", "inventory.*") in data.nvmegate.roles, so a
// DescribeFunc that returns an action other than the method's decides which
// rules apply. input.resource holds the stored records the request
// involves (job scope, subsystem, namespaces with tenant, region, data
// class and dataset, target with region and fabric, host bindings) and the
// request's own asks (requested host NQN, TTL, mode); policy/README.md
// documents every key, which actions need which, and an example.
//
// # Decision document (data.nvmegate.authz.decision)
//
//	{
//	  "allow":       true,
//	  "reasons":     ["role node may perform access.connect in job j1"],
//	  "obligations": {"max_ttl": "1h", "require_tls": true, "auth_mode": "tls", "read_only": true}
//	}
//
// All three fields are required. reasons is an array of non-empty strings,
// non-empty on a deny: the rules that refused, or the rule that allowed.
// The default policy sets obligations for access.connect and access.renew
// (the grants) and {} for every other decision.
// Deny reasons are shown to the caller in the PermissionDenied message, so
// a policy must not put in them what the caller may not learn. obligations
// holds only these keys, each optional:
//
//	max_ttl        string   Go duration > 0 ("15m", "1h30m"): cap on a grant's lifetime
//	require_tls    boolean  the connection must use a TLS secure channel
//	auth_mode      string   "dhchap" | "tls" | "both"
//	min_hash       string   "sha256" | "sha384" | "sha512"
//	min_dh_group   string   "null" | "ffdhe2048" | "ffdhe3072" | "ffdhe4096" | "ffdhe6144" | "ffdhe8192"
//	bidirectional  boolean  the controller must authenticate to the host too
//	read_only      boolean  the host gets read-only access
//	max_iops       integer  >= 0, QoS cap; 0 = none
//	max_mbps       integer  >= 0, QoS cap; 0 = none
//	reauth_within  string   Go duration > 0: when a change makes a live grant's obligations
//	                        stronger than those it was issued under, how long it has to renew
//	                        before it is revoked (default 5m)
//
// max_ttl is a duration string rather than a number so a policy author
// never has to guess the unit; Rego compares them with time.parse_duration_ns.
//
// # Failing closed
//
// The engine denies, with a reason, whenever it cannot take the policy's
// word for an allow:
//
//   - the decision is undefined, not an object, has a non-boolean allow,
//     reasons that are not strings, a deny without reasons, missing or
//     unknown obligations or an obligation of the wrong type: a deny with
//     reason "policy decision is malformed: ..." and no error (a policy bug,
//     logged at error level; the self-test keeps such policies from loading
//     where a sample reaches the bug);
//   - OPA fails to evaluate (builtin errors are errors, not undefined): a
//     deny with reason "policy evaluation failed" and an error wrapping
//     ErrEvaluation, which the interceptors turn into codes.Internal (the
//     request failed, it was not judged), with the decision ID in the message
//     so the log line can be found;
//   - the call's context ends: a deny and the context's error.
//
// A policy is compiled once per revision (strict mode, Rego v1, without the
// network builtins http.send and net.lookup_ip_addr) with its data
// (policy.Bundle.Data, converted to OPA values once, in an in-memory store
// the decisions only read). Before it serves, the engine evaluates the
// policy's LoadCheckQuery once: problems in the data refuse the revision
// (ErrData), and the derived tables it returns are stored at
// data.nvmegate.derived. Then the revision must decide the samples of its
// selftest.json as stated. NewEngine and Reload refuse a revision that fails
// any step (ErrCompile, ErrData, ErrSelfTest), and Reload keeps the
// previous one.
//
// # Connect and renew in parts
//
// A policy may list actions in data.nvmegate.authz.split_actions (the
// default policy: access.connect and access.renew). The engine decides
// those in three parts (split.go, policy/connect.rego): a scope decision
// over the job's scope (no caller, no time) and a caller decision over the
// request without the time, each memoized by the SHA-256 of its canonical
// input and the policy and data revisions, and a node decision, evaluated
// on every call, that checks the time and returns the grant. The decision
// is the node decision's document, checked as any. A policy whose memoized
// parts reach a rule that reads what their inputs do not hold, or calls a
// nondeterministic builtin, does not load (ErrCompile); its self-test
// samples of split actions must be decided alike by the parts and by
// DecisionQuery, which composes them in Rego. Input.Scope, if set, hands
// the resource typed (see Scope): both memoized parts are then keyed and
// converted from it, and no map of the resource need exist.
//
// Every Decision gets a fresh ID (a UUIDv7: time-ordered, 74 random bits),
// the revision that decided it and the evaluation time.
package authz

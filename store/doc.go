// Package store persists the inventory (targets, subsystems, namespaces and
// host bindings), jobs and grants in a bbolt file, enforces the rules between
// records that no record can check on its own, and serves the reads of the
// connect path from an in-memory read model kept current by every commit.
//
// # Use
//
//	db, err := store.Open(filepath.Join(dir, "store.db"), store.Options{})
//	...
//	defer db.Close()
//	err = db.CreateTarget(ctx, &nvmegate.Target{...})
//	subs, next, err := db.ListSubsystems(ctx, store.SubsystemFilter{Tenant: "acme"}, store.Page{})
//
// Every method returns *nvmegate.Error for what the caller did (EINVALID
// with a field path, ENOTFOUND, EEXISTS, ECONFLICT) and a plain wrapped error
// for anything else (I/O, a corrupt file), which the gateway reports as
// EINTERNAL. Create
// methods return the record's own Validate error unchanged; its field is
// relative to the record ("region") and the gateway prefixes it. Errors of
// the cross-record rules name fields the same way ("port_ids[1]", "tenant").
//
// # Transactions
//
// Each Create and Delete is one write transaction: the rule checks and the
// writes see the same state, and bbolt fsyncs on commit, so a method that
// returned nil is durable. Reads not served by the read model (below) run
// in bbolt read transactions, concurrently with each other and with the
// single writer. The context is checked before a read or a transaction
// starts; a started transaction is not interrupted.
//
// # Read model
//
// The reads every Connect and every target reconcile make are served from
// memory, with no read transaction and no decoding: Target, Subsystem,
// Namespace, HostBinding, HostBindingByNQN, Job, Grant (of an active
// grant), NodeGrants, NodeActiveGrants, SubsystemGrants, ExpiredGrants, and
// ListSubsystems with a TargetID filter and ListNamespaces with a
// SubsystemNQN filter (what the target programmer lists). Ended grants and
// the other listings (admin pages, unfiltered or filtered otherwise) are
// read from the file.
//
// The model (model.go) holds the decoded targets, subsystems, namespaces,
// host bindings and jobs, the active grants, and the indexes those reads
// walk: subsystems by target, namespaces by subsystem, host bindings by
// canonical host NQN, active grants by subsystem and by node. Open loads it from the
// buckets, indexes from their own buckets, so that a damaged index is
// reported by a read as it was when reads walked the file. A record that
// does not decode is kept as its error, which a read reaching it returns;
// a malformed index key fails Open.
//
// It is fed as a stream of changes. Each write transaction records what it
// stores and deletes, as decoded values (a change: a revision and its ops);
// after bbolt's commit succeeded, apply plays the change onto the model
// under the model's lock, so a reader sees all of a commit or none of it,
// and changes are applied in commit order. A transaction that fails, in
// its function or at commit, is rolled back and its change dropped; a
// group commit (batch.go) that fails drops the group's change, and each
// write re-run alone records its own. apply is the model's only writer, so
// a replica's projection feeds it the changes the replicated log brings
// (journal.go: projectLocked).
//
// The revision numbers the commits: each write transaction stores the next
// one in the meta bucket, so it grows by one with every commit (a rolled
// back transaction takes none) and keeps growing across restarts.
// DB.Revision is the revision of the model, which a decision can name as
// the data it read.
//
// What a read returns is the caller's, to modify freely: records and grants
// are copies, a list is freshly allocated (SubsystemGrants copies its
// grants into one array). The exception is a job's slices (Nodes,
// Namespaces, AllowedRegions): a 10,000-node job is large, so they are the
// model's, shared by every caller. They must not be modified in place;
// they are clipped, so appending copies.
//
// The model keeps every job (finished ones too) but only active grants;
// its size is about that of the decoded inventory, the jobs and the active
// grants.
//
// # Layout (schema version 1)
//
//	meta                  "kind" -> "nvmegate/store"
//	                      "schema_version" -> uint64, big-endian
//	                      "revision" -> uint64, big-endian (of the last
//	                      commit; absent in a file never written to)
//	targets               target ID -> target JSON
//	subsystems            subsystem NQN -> subsystem JSON
//	subsystems_by_target  target ID 0x00 subsystem NQN -> "" (index)
//	namespaces            subsystem NQN 0x00 NSID (uint32, big-endian) -> namespace JSON
//	host_bindings         SPIFFE ID -> host binding JSON
//	host_bindings_by_nqn  canonical host NQN -> SPIFFE ID (unique index;
//	                      re-keyed on open if an older version wrote
//	                      another case), and, only in a file where an
//	                      older version bound one UUID NQN to two
//	                      identities in two cases, canonical host NQN
//	                      0x00 SPIFFE ID -> SPIFFE ID for each binding
//	                      but the first created (host.go,
//	                      canonicalizeHostIndex)
//	jobs                  job ID -> job JSON
//	grants                grant ID -> grant JSON
//	grants_by_subsystem   subsystem NQN 0x00 grant ID -> "" (active grants only)
//	grants_by_node        node 0x00 job 0x00 subsystem NQN 0x00 grant ID -> ""
//	                      (active grants only; filled on open if missing)
//	grants_by_host        canonical host NQN 0x00 node 0x00 grant ID -> ""
//	                      (active grants only; filled on open if missing)
//	grants_removal_pending grant ID -> "" (ended grants whose target has not
//	                      acknowledged removing the host: RemovalPending)
//	host_key_scopes       canonical host NQN 0x00 node 0x00 key scope ->
//	                      newest root version (uint64 BE) the node held the
//	                      NQN at, ended grants included: who could still
//	                      derive what on an NQN (filled on open if missing)
//	requests              forwarded write's request ID -> time (unix ns,
//	                      uint64 BE): a write a follower forwarded, so that
//	                      its retry through any later leader is not applied
//	                      again (forward.go)
//	requests_by_time      time (unix ns, uint64 BE) || request ID -> "": the
//	                      IDs by age, pruned after requestKeep
//
// Grant writes are group-committed: concurrent PutGrants share one
// transaction (batch.go).
//
// NQNs, IDs and labels contain no control characters, so 0x00 separates the
// parts of a composite key unambiguously and makes each subsystem's
// namespaces, and each target's subsystems, one contiguous key range. Records
// are JSON of private structs with fixed field names and a record version
// "v" (codec.go), decoupled from the Go field names of the domain types.
// Listing is in key order; a page token holds the last key returned, so a
// listing resumes strictly after it and stays consistent while records are
// inserted between calls. Filters on a subsystem's target (the index), a
// namespace's subsystem (its key range) and a namespace's tenant (one
// tenant per subsystem, so other tenants' subsystems are skipped by a seek)
// cost about the size of the answer; the other filters scan.
//
// Open creates missing buckets, stamps a new file, refuses a bbolt file that
// is not a store (ErrNotStore) and a file written with a newer schema
// (ErrSchemaTooNew). The flat key space is chosen so that an etcd backend can
// use the same keys under a prefix.
//
// # Invariants
//
// Enforced in the write transaction that could break them:
//
//   - Keys are unique: a second Create of the same target ID, subsystem NQN,
//     (subsystem NQN, NSID) or SPIFFE ID is EEXISTS.
//   - A subsystem is on an existing target, lists only ports of that target,
//     and if TLS is set at least one listed port offers a TLS secure channel.
//   - A namespace is in an existing subsystem and has that subsystem's tenant:
//     all namespaces of one subsystem belong to one tenant, since a host
//     connected to a subsystem sees every namespace in it.
//   - One host NQN, one identity. Host NQNs are compared in canonical form
//     (nvmegate.CanonicalNQN: a UUID NQN in any letter case is one host),
//     and a new binding's must be written canonically. A host NQN is bound
//     to at most one SPIFFE ID (host_bindings_by_nqn), so a node can never
//     be given a host NQN bound to another identity (ECONFLICT). Every
//     active grant on a host NQN is of one node, the one it is bound to if
//     it is bound: CreateHostBinding refuses a host NQN that another
//     identity's active grants use (ECONFLICT naming them: revoke them
//     first), and PutGrants refuses an active grant on a host NQN bound to
//     another identity or used by another node's active grant (grants_by_host).
//     Both checks run in the write transaction, so a binding and a grant
//     racing for one NQN cannot both commit: nvmet keys a host once per
//     NQN per target, and the second identity would hold the first's
//     credentials there. Removing a binding leaves its node's grants
//     active, and so its NQN held, until they end.
//   - Nothing dangles: a target with subsystems and a subsystem with
//     namespaces cannot be deleted (ECONFLICT naming what is left).
//   - The indexes match the records: subsystems_by_target holds exactly one
//     entry per subsystem, host_bindings_by_nqn exactly one per binding,
//     grants_by_subsystem, grants_by_node and grants_by_host one per
//     active grant.
//   - A grant's job, node, host NQN and subsystem never change, and an
//     ended grant never becomes active again (ECONFLICT).
//   - No grant is opened or renewed in a job that is no longer active
//     (ECONFLICT, checked in the grant's commit against the job as
//     committed): finishing a job revokes the grants active when it
//     committed, and none can follow.
//
// Records are never updated in place; a change is a delete and a create,
// which re-runs every rule.
package store

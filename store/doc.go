// Package store persists the inventory (targets, subsystems, namespaces and
// host bindings) in a bbolt file, and enforces the rules between records that
// no record can check on its own.
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
// Reads run in bbolt read transactions, concurrently with each other and
// with the single writer. Each Create and Delete is one write transaction:
// the rule checks and the writes see the same state, and bbolt fsyncs on
// commit, so a method that returned nil is durable. The context is checked
// before a transaction starts; a started transaction is not interrupted.
//
// # Layout (schema version 1)
//
//	meta                  "kind" -> "nvmegate/store"
//	                      "schema_version" -> uint64, big-endian
//	targets               target ID -> target JSON
//	subsystems            subsystem NQN -> subsystem JSON
//	subsystems_by_target  target ID 0x00 subsystem NQN -> "" (index)
//	namespaces            subsystem NQN 0x00 NSID (uint32, big-endian) -> namespace JSON
//	host_bindings         SPIFFE ID -> host binding JSON
//	host_bindings_by_nqn  host NQN -> SPIFFE ID (unique index)
//	jobs                  job ID -> job JSON
//	grants                grant ID -> grant JSON
//	grants_by_subsystem   subsystem NQN 0x00 grant ID -> "" (active grants only)
//	grants_by_node        node 0x00 job 0x00 subsystem NQN 0x00 grant ID -> ""
//	                      (active grants only; filled on open if missing)
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
//   - A host NQN is bound to at most one SPIFFE ID (host_bindings_by_nqn), so
//     a node can never be given a host NQN bound to another identity
//     (ECONFLICT).
//   - Nothing dangles: a target with subsystems and a subsystem with
//     namespaces cannot be deleted (ECONFLICT naming what is left).
//   - The indexes match the records: subsystems_by_target holds exactly one
//     entry per subsystem, host_bindings_by_nqn exactly one per binding.
//
// Records are never updated in place; a change is a delete and a create,
// which re-runs every rule.
package store

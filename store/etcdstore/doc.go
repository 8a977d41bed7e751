// Package etcdstore keeps the inventory store replicated in etcd: the
// store.Replica of a deployment of several gateway replicas. Each
// replica's bbolt file is its copy, serving reads and the read model; the
// order of writes, and the writes themselves, are etcd's.
//
// # Keys (under the prefix, e.g. "/nvmegate/store/")
//
//	rev                 the store revision (uint64 BE): one per committed
//	                    write transaction of any replica
//	ch/<rev>            the change of that revision (16 hex digits): its
//	                    writes, each flags (1: delete) || bucket length
//	                    (1 byte) || bucket || uvarint key length || key ||
//	                    uvarint value length || value
//	snap                the revision of the latest snapshot (uint64 BE) ||
//	                    its chunk count (uint32 BE)
//	snap/<rev>/<i>      the snapshot's chunks (8 hex digits), writes as in
//	                    a change, at most about 1 MiB each
//
// A commit is one etcd transaction — if rev is still the revision the
// write read (and, for a leader's write, the leadership key is still the
// leader's: Fence), put rev and the change — so of two replicas writing
// at once one commits and the other applies the first's change and runs
// its transaction again on top of it: no lost update. The transaction is
// three operations whatever the change's size, within etcd's default
// limit of 128 per transaction. Changes are kept until the leader writes a
// snapshot covering them (Compact); a replica further behind than that
// loads the snapshot. etcd holds the records as the store holds them: no
// secret (grants name key versions, never keys).
package etcdstore

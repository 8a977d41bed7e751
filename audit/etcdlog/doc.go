// Package etcdlog keeps the audit log replicated in etcd: the
// audit.Replica of a deployment of several gateway replicas, which share
// one log (one origin) whose commits and checkpoints are durable on a
// quorum of etcd members before an append returns.
//
// # Keys (under the prefix, e.g. "/nvmegate/audit/")
//
//	tree            size (uint64 BE) || root (32 bytes): the tree's head
//	c/<start>       one group commit, <start> its first index (16 hex
//	                digits): end (uint64 BE) || root before || root after ||
//	                entry-bundle records
//	cp              the size of the latest checkpoint (uint64 BE)
//	start           size (uint64 BE) || root: the tree the first stored
//	                commit extends (absent: the first commit starts at 0)
//	pos/<name>      the size of replica name's copy on its disk (uint64
//	                BE), under the replica's lease
//	cp/<size>       a signed checkpoint (16 hex digits): key version
//	                (uint64 BE) || PEM length (uint32 BE) || public key PEM
//	                || signed note
//
// An append is one etcd transaction: if the tree's head is still the one
// the commit extends, put the new head and the commit. Writers are fenced
// by that compare: of two that extend the same head, one stores nothing
// and learns of the other's commit (audit.ErrConflict). etcd's compaction
// of old revisions loses no entry: nothing is overwritten.
//
// etcd holds the log's tail only (trim.go): the leader deletes the commits
// every live replica's copy holds on its disk, in one fenced transaction
// that moves start, and compacts etcd's history after it. A copy behind the
// tail fetches the history from another copy (audit.HistorySource),
// checked against start's root. etcd holds no secret: entries carry key
// versions and fingerprints, never keys.
package etcdlog

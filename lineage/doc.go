// Package lineage builds and verifies a job's signed lineage attestation:
// an in-toto Statement v1 in a DSSE envelope, signed through attest, whose
// subjects are the datasets the job was given (name and sha256 digest from
// the inventory) and whose predicate (PredicateType) records the job, its
// tenant, scheduler, nodes, namespaces and modes, the first and last
// access, the policy revisions and key versions involved, and the audit
// log's origin with a signed checkpoint and, for every log entry of the
// job, the entry itself and its inclusion proof.
//
// Verify checks all of it offline with the log's public keys: the envelope
// signature, the checkpoint signature, every entry's hash and inclusion
// proof, that every entry belongs to the job, and that the subjects are
// the datasets the entries name. An auditor needs nothing from the gateway.
package lineage

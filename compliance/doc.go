// Package compliance builds and verifies the gateway's compliance
// attestation: an in-toto Statement v1 in a DSSE envelope, signed with the
// audit log's key (attest), whose predicate (PredicateType) states the
// fabric at one moment — the policy and data revisions; per tenant and
// namespace its placement, the residency verdict of the policy serving,
// the ages of its access root and key-encryption key against the rotation
// period its class declares (rotate_every); every active grant with the
// verdict of deciding it again; and everything out of compliance, named —
// anchored to a signed checkpoint of the log. Its subject is that
// checkpoint (the log's origin, the root hash).
//
// The attestation's digest is then appended to the log as an entry of its
// own kind (audit.EventComplianceAttestation), and a Bundle carries the
// envelope with that entry, its inclusion proof under a later checkpoint
// and the consistency proof from the anchor to it. Verify checks all of it
// offline with the log's public keys: an auditor needs nothing from the
// gateway to know the attestation was signed by the log's key, describes
// the log at its anchor, and was itself recorded in that log. What it
// cannot know from that is whether the attestation is current: a replayed
// one verifies as well. Freshness.Check bounds its signed time (a maximum
// age, DefaultMaxAge unless the verifier chooses, and a not-before time).
package compliance

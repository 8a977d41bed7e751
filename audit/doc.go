// Package audit is nvmegate's signed, append-only, tamper-evident access
// log: every decision and state change is an entry in an RFC 6962 Merkle
// tree stored in its own bbolt file, committed and fsync'd before the
// gateway answers, covered by signed C2SP checkpoints, provable by
// inclusion and consistency proofs, and exportable in the C2SP tlog-tiles
// layout for auditors who verify it offline without trusting the gateway.
//
// # Use
//
//	keys, _ := attest.OpenKeyDir("/var/lib/nvmegate/log-keys", attest.Ed25519, true)
//	log, err := audit.Open("/var/lib/nvmegate/audit.db", audit.Options{
//		Origin: "nvmegate.example.com/audit",
//		Signer: keys,
//	})
//	defer log.Close()
//	go (&audit.Checkpointer{Log: log}).Run(ctx) // ≥ 1 checkpoint/s under load, one at shutdown
//
//	idx, leaf, err := log.Append(ctx, audit.Entry{Kind: audit.EventGrant, JobID: "job-7", ...})
//	if err != nil {
//		// not durable: deny (fail closed)
//	}
//
//	recs, next, err := log.Query(ctx, audit.Filter{JobID: "job-7"}, audit.Page{})
//	cp, _ := log.Checkpoint(ctx)
//	proof, _ := log.InclusionProof(ctx, idx, cp.Size)
//	_, err = log.Export(ctx, "/tmp/audit-export", 0)
//	report, err := audit.Verify(ctx, "/tmp/audit-export", trustedKeys, savedCheckpoint, progress)
//
// # Entries (schema version 1)
//
// An entry is canonical JSON: the members of every object in sorted key
// order, no insignificant whitespace, strings escaped as RFC 8785 does
// (only '"', '\' and control characters; \b \t \n \f \r or \u00xx),
// integers in plain decimal, times as "YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ"
// (UTC, nine fraction digits). Optional top-level members are omitted when
// empty; members of nested objects are always present. DecodeEntry accepts
// only this form, so each entry has exactly one encoding.
//
//	{
//	  "caller":        SPIFFE ID of the caller                       (optional)
//	  "decision":      {"allow": bool, "id": decision ID,
//	                    "policy_revision": string, "reasons": [string]} (optional)
//	  "detail":        free text, no secrets                          (optional)
//	  "expires_at":    expiry of the grant or job                     (optional)
//	  "grant_id":      the grant (lease)                              (optional)
//	  "host_nqn":      host NQN                                       (optional)
//	  "job_id":        training job ID                                (optional)
//	  "keys":          [{"class": "access_root"|"dek"|"log_signing"|…,
//	                     "fingerprint": keyed hash, "id": key name,
//	                     "version": int}]                             (optional)
//	  "kind":          grant | deny | invalid_argument | renew | release |
//	                   expire | revoke | job_admit | job_finish | job_nodes |
//	                   key_rotation | inventory_change | policy_load |
//	                   target_apply | reauth_required | compliance_attestation
//	  "namespaces":    [{"dataset": name, "dataset_digest": digest,
//	                     "mode": "ro"|"rw"|"", "nsid": int,
//	                     "subsystem_nqn": NQN}]                        (optional)
//	  "subsystem_nqn": subsystem NQN                                  (optional)
//	  "tenant":        tenant                                         (optional)
//	  "time":          when it happened
//	  "v":             1
//	}
//
// A deny entry is a refusal by policy (with its decision), by a target, or
// of a grant that is not the caller's. An invalid_argument entry is a
// request refused as malformed before policy saw it: the caller, and a
// detail "<RPC>: invalid argument: <field>: <rule>" in which every value
// the caller sent is withheld ("…"); nothing else of the request. Kinds
// added after version 1 (invalid_argument) leave the encoding as it was: a
// decoder accepts any lower-case kind.
//
// A revoke entry made because a change re-decided the grant (the gateway
// re-decides the active grants a policy revision, an inventory, binding or
// job change can affect) carries the new decision — its policy revision
// and reasons — and a detail naming the change and the store's data
// revision. A reauth_required entry is a grant still allowed whose
// obligations that change made stronger: its decision is the new one, its
// detail what it falls short of and the deadline by which it must renew,
// or be revoked.
//
// Entries carry key versions and fingerprints (keyed hashes), never key
// material. As a last line of defence Append refuses, with ErrKeyMaterial
// and without echoing the value, an entry any of whose strings contains a
// DH-HMAC-CHAP secret ("DHHC-1:"), an NVMe TLS PSK ("NVMeTLSkey-1:") or a
// PEM private key, in any letter case.
//
// The leaf hash of an entry is SHA-256(0x00 || entry bytes) (RFC 6962);
// interior nodes are SHA-256(0x01 || left || right).
//
// # Durability and group commit
//
// Append encodes and hashes the entry in the caller's goroutine and hands
// it to a single writer goroutine, which takes the first waiting entry and
// every other one already queued (up to Options.MaxBatch) and commits them
// in one bbolt transaction: bbolt fsyncs the data and then the meta page
// before Commit returns, and only then does Append return. There is no
// timer: a lone append commits at once (one fsync pair, about 1 ms here),
// while appends that arrive during a commit share the next one. bbolt's own
// Batch is not used (it may run a function twice). A crash loses no
// acknowledged entry: the crash test kills a writing child with SIGKILL
// twenty times and finds every acknowledged index.
//
// If a commit fails (disk full, I/O error) every Append of the batch
// returns an error wrapping ErrUnavailable; the log reopens the file,
// reloads and re-checks its state, and goes on. An Append that failed may
// or may not be in the log: the gateway denies either way.
//
// # Checkpoints
//
// A checkpoint is a C2SP tlog-checkpoint body, "<origin>\n<size>\n<base64
// root>\n", signed as a C2SP signed note under the origin as key name (see
// attest for the Ed25519 and ECDSA signature types and key IDs). Before
// signing, Checkpoint proves the new tree consistent with the previous
// checkpoint (proof.VerifyConsistency over a proof from the stored tiles)
// and refuses with *InconsistentError otherwise. Every checkpoint is kept,
// and the public key of every key version that signed one.
//
// # File layout (bbolt, store schema version 1)
//
//	meta           "kind" → "nvmegate/audit", "schema_version" → uint64 BE,
//	               "origin" → origin, "tree" → size (uint64 BE) || the
//	               compact range (hashes of the perfect subtrees covering
//	               [0, size), left to right; an append is O(log n)),
//	               "indexed" → index up to which the index buckets are complete
//	entries        first index of a commit (uint64 BE) → nested bucket with
//	               "d" → the commit's entries as entry-bundle records
//	               (uint16 BE length || bytes)
//	tiles          tile level (1 byte) || tile index (uint64 BE) → the hashes
//	               of tree level 8·L nodes [256·N, 256·N+w) (C2SP hash tile);
//	               a proof node between tile levels is rehashed from ≤ 128
//	               stored hashes, so proofs are O(log n) reads
//	checkpoints    tree size (uint64 BE) → signed checkpoint note
//	keys           key ID ("sha256:<hex SPKI>") → version || first size
//	               signed (uint64 BE each) || public key PEM
//	idx_job        job ID 0x00 first index → uvarint-delta posting list
//	idx_tenant     tenant 0x00 first index → postings
//	idx_namespace  subsystem NQN 0x00 NSID (uint32 BE; 0: the subsystem as a
//	               whole, 0xFFFFFFFF: any) first index → postings
//	idx_time       first index of a commit → min time, max time (Unix ns),
//	               entry count
//
// The job, tenant and namespace postings are derived data: the writer keeps
// those of recent entries in memory and flushes them every 8192 entries in
// one of its commits (per-commit postings would touch one B-tree leaf per
// distinct key and cost more than the entries); Open re-indexes the tail
// after a crash. Queries read both and return entries in index order.
//
// # Export and offline verification
//
// Export writes C2SP tlog-tiles: "checkpoint", "tile/<L>/<N>[.p/<W>]" hash
// tiles, "tile/entries/<N>[.p/<W>]" entry bundles, plus "checkpoints/<size>"
// (every earlier checkpoint) and "keys/v<N>.pem" and "keys/v<N>.vkey" (every
// signing-key version). Verify recomputes every leaf hash, the tree, every
// hash tile and the roots at every earlier checkpoint's size, trusting only
// the keys it is given, and names each failure with its Kind and location:
//
//	modified_entry           entry bytes differ from the committed leaf hash
//	missing_entry            an entry is nowhere in the log (removed; later ones moved up)
//	reordered_entry          an entry is the one committed at another index (swapped, moved)
//	extra_entry              entries no signed checkpoint covers (appended, inserted)
//	malformed_entry          not a canonical entry
//	missing_tile             a hash tile or entry bundle is missing
//	tile_mismatch            a hash tile disagrees with what is below it
//	truncated                the log ends before the signed size
//	root_mismatch            nothing hashes to the signed root
//	inconsistent_checkpoint  a fork: not an extension of an earlier checkpoint
//	rollback                 the checkpoint is older than an earlier one
//	bad_signature            a trusted key's signature does not verify
//	unknown_key              no signature by a trusted key
//	malformed_checkpoint, missing_checkpoint
//
// CheckFile runs the same checks on a log's bbolt file.
package audit

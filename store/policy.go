package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
)

// The policy in force is a record of the store, so that it is a
// projection of the log like every other: a policy load is a change
// sequenced by the leader, with its policy_load entry in the same commit,
// and every replica swaps to the new policy when its projection applies
// that change (Options.PolicyLoaded) — a call after its read barrier
// decides under the policy of the position the replica has applied.

var (
	bucketPolicy = []byte("policy")
	policyActive = []byte("active")
)

// Policy is a policy bundle as the store keeps it: its files as loaded
// (policy.Bundle.Files: every file its digest covers), its revision and
// digest, where it was read from, and when it was made the one in force.
type Policy struct {
	Revision string            `json:"revision"`
	Digest   string            `json:"digest"`
	Source   string            `json:"source"`
	Files    map[string][]byte `json:"files"`
	LoadedAt time.Time         `json:"loaded_at"`
}

// MaxPolicyBytes bounds a policy's files: a load is one commit of the
// replicated log, within etcd's request limit. (Staging larger bundles by
// digest is not built.)
const MaxPolicyBytes = 1 << 20

func encodePolicy(p *Policy) ([]byte, error) { return json.Marshal(p) }

func decodePolicy(v []byte) (*Policy, error) {
	var p Policy
	if err := json.Unmarshal(v, &p); err != nil {
		return nil, fmt.Errorf("store: policy record: %w", err)
	}
	if p.Digest == "" {
		return nil, errors.New("store: policy record without a digest")
	}
	return &p, nil
}

// Policy is the policy in force (nil: none loaded through the store yet).
// The files are shared: the caller must not modify them.
func (db *DB) Policy() *Policy {
	db.model.mu.RLock()
	defer db.model.mu.RUnlock()
	return db.model.policy
}

// LoadPolicy makes p the policy in force, with entry (its policy_load
// entry) in the same commit. A policy of the digest in force already is
// not loaded again: loaded is false and nothing is written.
func (db *DB) LoadPolicy(ctx context.Context, p *Policy, entry audit.Entry) (loaded bool, err error) {
	if p == nil || p.Digest == "" || len(p.Files) == 0 {
		return false, nvmegate.Invalid("policy", "a policy needs its files and digest")
	}
	n := 0
	for name, data := range p.Files {
		n += len(name) + len(data)
	}
	if n > MaxPolicyBytes {
		return false, nvmegate.Errorf(nvmegate.EINVALID, "the policy bundle holds %d bytes; at most %d can be loaded through the replicated log", n, MaxPolicyBytes)
	}
	if db.forwards() {
		o := &loadPolicyOp{Policy: p, Entry: entry}
		if ok, err := db.remote(ctx, "load_policy", o); ok {
			return o.Loaded, err
		}
	}
	var entries []audit.Entry
	if db.journal != nil {
		entries = []audit.Entry{entry}
	}
	write := func(tx *txn) error {
		if cur := tx.policy(); cur != nil && cur.Digest == p.Digest {
			return nil
		}
		stored := *p
		stored.Files = maps.Clone(p.Files)
		if stored.LoadedAt.IsZero() {
			stored.LoadedAt = db.now().UTC()
		}
		val, err := encodePolicy(&stored)
		if err != nil {
			return err
		}
		tx.record(op{policy: &stored})
		loaded = true
		return put(tx, bucketPolicy, policyActive, val)
	}
	if db.journal != nil {
		err = db.propose(ctx, entries, func(tx *txn) error {
			if cur := tx.policy(); cur != nil && cur.Digest == p.Digest {
				return errNoChange // no entry either: nothing was loaded
			}
			return write(tx)
		})
		return loaded, err
	}
	return loaded, db.update(ctx, write)
}

// policy is the policy in force as tx sees it: the last one a change
// before it in the transaction (or in flight before it) loaded, else the
// model's.
func (tx *txn) policy() *Policy {
	for i := len(tx.ops) - 1; i >= 0; i-- {
		if p := tx.ops[i].policy; p != nil {
			return p
		}
	}
	tx.model.mu.RLock()
	defer tx.model.mu.RUnlock()
	return tx.model.policy
}

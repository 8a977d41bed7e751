package store

import (
	"context"
	"fmt"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// HostBindingFilter narrows ListHostBindings; empty fields match everything.
type HostBindingFilter struct {
	Tenant string
}

// CreateHostBinding stores a new binding and sets its CreatedAt. Beyond the
// binding's own validation it fails with EEXISTS if the SPIFFE ID already
// has a binding, and with ECONFLICT if the host NQN is bound to another
// identity. The second
// rule is what guarantees that a node never obtains credentials for a host
// NQN bound to someone else; the error does not name that other identity.
func (db *DB) CreateHostBinding(ctx context.Context, h *nvmegate.HostBinding) error {
	if h == nil {
		return nvmegate.Invalid("", "a host binding is required")
	}
	if err := h.Validate(); err != nil {
		return err
	}
	rec := *h
	rec.CreatedAt = db.now().UTC()
	val, err := encodeHostBinding(&rec)
	if err != nil {
		return err
	}
	stored, err := decodeHostBinding(val)
	if err != nil {
		return err
	}
	err = db.update(ctx, func(tx *txn) error {
		k := []byte(h.SPIFFEID)
		if tx.Bucket(bucketHostBindings).Get(k) != nil {
			return nvmegate.Errorf(nvmegate.EEXISTS, "host binding for %q already exists", h.SPIFFEID)
		}
		nqn := []byte(h.HostNQN)
		if tx.Bucket(bucketHostBindingsByNQN).Get(nqn) != nil {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is already bound to another identity", h.HostNQN)
		}
		tx.record(op{binding: stored})
		if err := put(tx, bucketHostBindings, k, val); err != nil {
			return err
		}
		return put(tx, bucketHostBindingsByNQN, nqn, k)
	})
	if err != nil {
		return err
	}
	h.CreatedAt = rec.CreatedAt
	return nil
}

// HostBinding returns the binding of a SPIFFE ID, or ENOTFOUND.
func (db *DB) HostBinding(ctx context.Context, spiffeID string) (*nvmegate.HostBinding, error) {
	return db.model.hostBinding(ctx, spiffeID)
}

func getHostBinding(tx *bolt.Tx, spiffeID string) (*nvmegate.HostBinding, error) {
	v := tx.Bucket(bucketHostBindings).Get([]byte(spiffeID))
	if v == nil {
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "host binding for %q not found", spiffeID)
	}
	return decodeHostBinding(v)
}

// HostBindingByNQN returns the binding that holds a host NQN, or ENOTFOUND
// if the NQN is bound to no identity. The gateway calls it before using a
// node's derived default NQN, so that the default can never be one that an
// explicit binding gave to another node.
//
// The index entry and the binding are cross-checked: an inconsistent index
// is an internal error, never an answer.
func (db *DB) HostBindingByNQN(ctx context.Context, hostNQN string) (*nvmegate.HostBinding, error) {
	return db.model.hostBindingByNQN(ctx, hostNQN)
}

// ListHostBindings returns bindings in SPIFFE ID order, one page at a time,
// and the token of the next page ("" after the last).
func (db *DB) ListHostBindings(ctx context.Context, f HostBindingFilter, page Page) ([]*nvmegate.HostBinding, string, error) {
	size, after, err := page.parse(kindHostBindings)
	if err != nil {
		return nil, "", err
	}
	var (
		items []*nvmegate.HostBinding
		next  []byte
	)
	err = db.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketHostBindings).Cursor()
		items, next, err = scanPage(c, nil, after, size, func(_, v []byte) (*nvmegate.HostBinding, bool, []byte, error) {
			h, err := decodeHostBinding(v)
			if err != nil {
				return nil, false, nil, err
			}
			return h, f.Tenant == "" || h.Tenant == f.Tenant, nil, nil
		})
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return items, encodeToken(kindHostBindings, next), nil
}

// DeleteHostBinding removes the binding of a SPIFFE ID and frees its host
// NQN, or fails with ENOTFOUND.
func (db *DB) DeleteHostBinding(ctx context.Context, spiffeID string) error {
	return db.update(ctx, func(tx *txn) error {
		h, err := getHostBinding(tx.Tx, spiffeID)
		if err != nil {
			return err
		}
		nqn := []byte(h.HostNQN)
		if owner := tx.Bucket(bucketHostBindingsByNQN).Get(nqn); string(owner) != spiffeID {
			return fmt.Errorf("store: index %s: host NQN %q of %q points to %q", bucketHostBindingsByNQN, h.HostNQN, spiffeID, owner)
		}
		if err := del(tx, bucketHostBindingsByNQN, nqn); err != nil {
			return err
		}
		tx.record(op{del: true, binding: h})
		return del(tx, bucketHostBindings, []byte(spiffeID))
	})
}

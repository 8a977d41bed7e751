package store

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// HostBindingFilter narrows ListHostBindings; empty fields match everything.
type HostBindingFilter struct {
	Tenant string
}

// CreateHostBinding stores a new binding and sets its CreatedAt. Beyond the
// binding's own validation (its host NQN must be canonical) it fails with
// EEXISTS if the SPIFFE ID already has a binding, and with ECONFLICT if the
// host NQN, compared canonically (nvmegate.CanonicalNQN), is bound to
// another identity or is the host NQN of an active grant of another
// identity. The second rule is what guarantees that a node never obtains
// credentials for a host NQN bound to someone else; the third, that a node
// bound to a host NQN never shares it with another identity's grant (the
// derived default NQN of an unbound node, say), which a target would take
// for the same host. The errors do not name the other identity; the third
// names the grants (the first and how many more), to revoke before the
// binding can be made.
func (db *DB) CreateHostBinding(ctx context.Context, h *nvmegate.HostBinding) error {
	if h == nil {
		return nvmegate.Invalid("", "a host binding is required")
	}
	if ok, err := db.remote(ctx, "create_host_binding", &createOp[nvmegate.HostBinding]{Record: h}); ok {
		return err
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
		canon := nvmegate.CanonicalNQN(h.HostNQN)
		nqn := []byte(canon)
		if tx.Bucket(bucketHostBindingsByNQN).Get(nqn) != nil {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is already bound to another identity", h.HostNQN)
		}
		// In this transaction, so that a grant committed concurrently is
		// either seen here or sees this binding (putGrant).
		if first, n := otherHostGrants(tx.Tx, canon, h.SPIFFEID); n > 0 {
			more := ""
			if n > 1 {
				more = fmt.Sprintf(" and %d more", n-1)
			}
			return nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is in use by active grant %s%s of another identity; revoke them first", h.HostNQN, first, more)
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

// HostBindingByNQN returns the binding that holds a host NQN, compared
// canonically (nvmegate.CanonicalNQN: a UUID NQN in any letter case), or
// ENOTFOUND if the NQN is bound to no identity. The gateway calls it
// before using a node's derived default NQN, so that the default can never
// be one that an explicit binding gave to another node (and the grant's
// commit checks again, putGrant).
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
// NQN, or fails with ENOTFOUND. A host NQN that an older version let two
// identities hold in different letter cases (see canonicalizeHostIndex) is
// freed only once the last of them is removed: removing the binding that
// holds it while another still shares it fails with ECONFLICT naming that
// other binding.
func (db *DB) DeleteHostBinding(ctx context.Context, spiffeID string) error {
	if ok, err := db.remote(ctx, "delete_host_binding", &deleteOp{Kind: "host_binding", ID: spiffeID}); ok {
		return err
	}
	return db.update(ctx, func(tx *txn) error {
		h, err := getHostBinding(tx.Tx, spiffeID)
		if err != nil {
			return err
		}
		idx := tx.Bucket(bucketHostBindingsByNQN)
		canon := nvmegate.CanonicalNQN(h.HostNQN)
		key := []byte(canon)
		switch owner := idx.Get(key); {
		case string(owner) == spiffeID:
			if other := sharingBinding(tx.Tx, canon); other != "" {
				return nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is also bound, in another letter case, to %s (stored before host NQNs were compared canonically); remove that binding first", h.HostNQN, other)
			}
		case string(idx.Get(indexKey(canon, spiffeID))) == spiffeID:
			key = indexKey(canon, spiffeID) // one of those sharing it
		default:
			return fmt.Errorf("store: index %s: host NQN %q of %q points to %q", bucketHostBindingsByNQN, h.HostNQN, spiffeID, owner)
		}
		if err := del(tx, bucketHostBindingsByNQN, key); err != nil {
			return err
		}
		tx.record(op{del: true, binding: h})
		return del(tx, bucketHostBindings, []byte(spiffeID))
	})
}

// sharingBinding is the first identity that holds canonical host NQN canon
// besides the one its index entry names (see canonicalizeHostIndex), or "".
func sharingBinding(tx *bolt.Tx, canon string) string {
	p := indexPrefix(canon)
	k, v := tx.Bucket(bucketHostBindingsByNQN).Cursor().Seek(p)
	if k == nil || !bytes.HasPrefix(k, p) {
		return ""
	}
	return string(v)
}

// canonicalizeHostIndex keys host_bindings_by_nqn by canonical host NQN
// (nvmegate.CanonicalNQN), as this version looks it up. A file written
// before host NQNs were compared canonically may key a UUID NQN in upper
// case, and may even bind one UUID NQN to two identities in two letter
// cases. Of those, the binding created first keeps the NQN (its entry is
// the canonical NQN); each other is kept under "canonical NQN 0x00 SPIFFE
// ID": it is no lookup's answer, so its node is granted nothing on that
// NQN (putGrant), and it must be removed before the first can be. Run on
// every Open; it changes nothing in a file already canonical.
func canonicalizeHostIndex(tx *bolt.Tx) error {
	idx := tx.Bucket(bucketHostBindingsByNQN)
	stale := map[string][]string{} // canonical NQN -> the keys to re-key
	err := idx.ForEach(func(k, _ []byte) error {
		if c := nvmegate.CanonicalNQN(string(k)); c != string(k) && bytes.IndexByte(k, keySep) < 0 {
			stale[c] = append(stale[c], string(k))
		}
		return nil
	})
	if err != nil || len(stale) == 0 {
		return err
	}
	bindings := tx.Bucket(bucketHostBindings)
	for _, canon := range slices.Sorted(maps.Keys(stale)) {
		var ids []string
		if v := idx.Get([]byte(canon)); v != nil {
			ids = append(ids, string(v))
		}
		for _, k := range stale[canon] {
			ids = append(ids, string(idx.Get([]byte(k))))
			if err := idx.Delete([]byte(k)); err != nil {
				return err
			}
		}
		// The first created keeps it; a binding that does not decode
		// (reported by the reads that reach it) comes last.
		created := func(id string) (time.Time, bool) {
			h, err := decodeHostBinding(bindings.Get([]byte(id)))
			if err != nil {
				return time.Time{}, false
			}
			return h.CreatedAt, true
		}
		slices.SortFunc(ids, func(a, b string) int {
			ta, oka := created(a)
			tb, okb := created(b)
			if oka != okb {
				if oka {
					return -1
				}
				return 1
			}
			return cmp.Or(ta.Compare(tb), strings.Compare(a, b))
		})
		ids = slices.Compact(ids) // one identity under two spellings
		if err := idx.Put([]byte(canon), []byte(ids[0])); err != nil {
			return err
		}
		for _, id := range ids[1:] {
			if err := idx.Put(indexKey(canon, id), []byte(id)); err != nil {
				return err
			}
		}
	}
	return nil
}

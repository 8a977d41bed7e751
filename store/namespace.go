package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// NamespaceFilter narrows ListNamespaces; empty fields match everything.
type NamespaceFilter struct {
	Tenant       string
	SubsystemNQN string
	Region       string
}

// CreateNamespace stores a new namespace and sets its CreatedAt. Beyond the
// namespace's own validation it fails with EEXISTS if the subsystem already
// has the NSID, and with EINVALID if the subsystem does not exist
// (subsystem_nqn), belongs to another tenant (tenant) or claims a region
// other than its target's (region).
//
// The tenant rule keeps the invariant that all namespaces of one subsystem
// belong to one tenant: targets do not mask namespaces per host, so a host
// connected to a subsystem sees all of them. The check and the write are one
// transaction, and a subsystem's tenant never changes, so concurrent creates
// cannot break it.
func (db *DB) CreateNamespace(ctx context.Context, n *nvmegate.Namespace) error {
	if n == nil {
		return nvmegate.Invalid("", "a namespace is required")
	}
	if ok, err := db.remote(ctx, "create_namespace", &createOp[nvmegate.Namespace]{Record: n}); ok {
		return err
	}
	if err := n.Validate(); err != nil {
		return err
	}
	rec := *n
	rec.CreatedAt = db.now().UTC()
	rec.Incarnation = newIncarnation()
	val, err := encodeNamespace(&rec)
	if err != nil {
		return err
	}
	stored, err := decodeNamespace(val)
	if err != nil {
		return err
	}
	err = db.update(ctx, func(tx *txn) error {
		k := namespaceKey(n.SubsystemNQN, n.NSID)
		if tx.Bucket(bucketNamespaces).Get(k) != nil {
			return nvmegate.Errorf(nvmegate.EEXISTS, "namespace %d of subsystem %q already exists", n.NSID, n.SubsystemNQN)
		}
		v := tx.Bucket(bucketSubsystems).Get([]byte(n.SubsystemNQN))
		if v == nil {
			return nvmegate.Invalid("subsystem_nqn", "no subsystem %q exists; a namespace must be in a registered subsystem", n.SubsystemNQN)
		}
		s, err := decodeSubsystem(v)
		if err != nil {
			return err
		}
		if n.Tenant != s.Tenant {
			return nvmegate.Invalid("tenant", "namespace tenant %q differs from tenant %q of subsystem %q: all namespaces of a subsystem belong to its tenant, because a host connected to it sees every namespace", n.Tenant, s.Tenant, s.NQN)
		}
		// The data of a namespace lives on its target: a residency region
		// other than the target's would let the inventory claim data is
		// where it is not, and every residency decision would rest on it.
		t, err := getTarget(tx.Tx, s.TargetID)
		if err != nil {
			return err
		}
		if n.Region != t.Region {
			return nvmegate.Invalid("region", "namespace region %q differs from region %q of its target %q: a namespace's data resides where its target is", n.Region, t.Region, t.ID)
		}
		if err := backingDeviceFree(tx, n, t.ID); err != nil {
			return err
		}
		tx.record(op{namespace: stored})
		return put(tx, bucketNamespaces, k, val)
	})
	if err != nil {
		return err
	}
	n.CreatedAt, n.Incarnation = rec.CreatedAt, rec.Incarnation
	return nil
}

// Namespace returns namespace nsid of subsystem nqn, or ENOTFOUND.
func (db *DB) Namespace(ctx context.Context, nqn string, nsid uint32) (*nvmegate.Namespace, error) {
	return db.model.namespace(ctx, nqn, nsid)
}

func getNamespace(tx *bolt.Tx, nqn string, nsid uint32) (*nvmegate.Namespace, error) {
	v := tx.Bucket(bucketNamespaces).Get(namespaceKey(nqn, nsid))
	if v == nil {
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "namespace %d of subsystem %q not found", nsid, nqn)
	}
	return decodeNamespace(v)
}

// ListNamespaces returns namespaces ordered by subsystem NQN, then NSID, one
// page at a time, and the token of the next page ("" after the last). With
// a SubsystemNQN filter (what the target programmer lists) it is served
// from the model's index of each subsystem's namespaces. Without, it scans
// the file: a Tenant filter reads one namespace of each other tenant's
// subsystem and seeks past the rest, which the one-tenant-per-subsystem
// invariant allows; Region filters while scanning.
func (db *DB) ListNamespaces(ctx context.Context, f NamespaceFilter, page Page) ([]*nvmegate.Namespace, string, error) {
	size, after, err := page.parse(kindNamespaces)
	if err != nil {
		return nil, "", err
	}
	var (
		items []*nvmegate.Namespace
		next  []byte
	)
	if f.SubsystemNQN != "" {
		items, next, err = db.model.subsystemNamespaces(ctx, f.SubsystemNQN, f.Tenant, f.Region, after, size)
		if err != nil {
			return nil, "", err
		}
		return items, encodeToken(kindNamespaces, next), nil
	}
	err = db.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketNamespaces).Cursor()
		items, next, err = scanPage(c, nil, after, size, func(_, v []byte) (*nvmegate.Namespace, bool, []byte, error) {
			n, err := decodeNamespace(v)
			if err != nil {
				return nil, false, nil, err
			}
			if f.Tenant != "" && n.Tenant != f.Tenant {
				// All namespaces of a subsystem have its tenant: skip
				// the rest of this one's key range.
				return nil, false, namespaceRangeEnd(n.SubsystemNQN), nil
			}
			return n, f.Region == "" || n.Region == f.Region, nil, nil
		})
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return items, encodeToken(kindNamespaces, next), nil
}

// DeleteNamespace removes namespace nsid of subsystem nqn, or fails with
// ENOTFOUND.
func (db *DB) DeleteNamespace(ctx context.Context, nqn string, nsid uint32) error {
	if ok, err := db.remote(ctx, "delete_namespace", &deleteNamespaceOp{NQN: nqn, NSID: nsid}); ok {
		return err
	}
	return db.update(ctx, func(tx *txn) error {
		k := namespaceKey(nqn, nsid)
		if tx.Bucket(bucketNamespaces).Get(k) == nil {
			return nvmegate.Errorf(nvmegate.ENOTFOUND, "namespace %d of subsystem %q not found", nsid, nqn)
		}
		tx.record(op{del: true, namespace: &nvmegate.Namespace{SubsystemNQN: nqn, NSID: nsid}})
		return del(tx, bucketNamespaces, k)
	})
}

// backingDeviceFree refuses a backing device another namespace of the same
// target already has: two dm-crypt mappings with two keys over one device
// would each destroy what the other wrote.
func backingDeviceFree(tx *txn, n *nvmegate.Namespace, targetID string) error {
	if n.BackingDevice == "" {
		return nil
	}
	return tx.Bucket(bucketNamespaces).ForEach(func(_, v []byte) error {
		o, err := decodeNamespace(v)
		if err != nil || o.BackingDevice != n.BackingDevice {
			return err
		}
		sv := tx.Bucket(bucketSubsystems).Get([]byte(o.SubsystemNQN))
		if sv == nil {
			return nil
		}
		osub, err := decodeSubsystem(sv)
		if err != nil {
			return err
		}
		if osub.TargetID == targetID {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "backing device %s of target %s already holds namespace %d of %s", n.BackingDevice, targetID, o.NSID, o.SubsystemNQN)
		}
		return nil
	})
}

// newIncarnation names a new namespace record: 128 random bits, in hex.
func newIncarnation() string {
	b := make([]byte, 16)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

package store

import (
	"bytes"
	"context"
	"strconv"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// SubsystemFilter narrows ListSubsystems; empty fields match everything.
type SubsystemFilter struct {
	Tenant   string
	TargetID string
}

// CreateSubsystem stores a new subsystem and sets its CreatedAt. Beyond the
// subsystem's own validation it fails with EEXISTS if the NQN is taken,
// and with EINVALID if its target does not exist (target_id), a port is not
// a port of that target (port_ids[i]), or TLS is set but none of its ports
// offers a TLS secure channel (tls).
func (db *DB) CreateSubsystem(ctx context.Context, s *nvmegate.Subsystem) error {
	if s == nil {
		return nvmegate.Invalid("", "a subsystem is required")
	}
	if ok, err := db.remote(ctx, "create_subsystem", &createOp[nvmegate.Subsystem]{Record: s}); ok {
		return err
	}
	if err := s.Validate(); err != nil {
		return err
	}
	rec := *s
	rec.CreatedAt = db.now().UTC()
	val, err := encodeSubsystem(&rec)
	if err != nil {
		return err
	}
	stored, err := decodeSubsystem(val)
	if err != nil {
		return err
	}
	err = db.update(ctx, func(tx *txn) error {
		k := []byte(s.NQN)
		if tx.Bucket(bucketSubsystems).Get(k) != nil {
			return nvmegate.Errorf(nvmegate.EEXISTS, "subsystem %q already exists", s.NQN)
		}
		if err := checkSubsystemPorts(tx.Tx, s); err != nil {
			return err
		}
		tx.record(op{subsystem: stored})
		if err := put(tx, bucketSubsystems, k, val); err != nil {
			return err
		}
		return put(tx, bucketSubsystemsByTarget, indexKey(s.TargetID, s.NQN), nil)
	})
	if err != nil {
		return err
	}
	s.CreatedAt = rec.CreatedAt
	return nil
}

// checkSubsystemPorts enforces the rules between a subsystem and its target.
func checkSubsystemPorts(tx *bolt.Tx, s *nvmegate.Subsystem) error {
	v := tx.Bucket(bucketTargets).Get([]byte(s.TargetID))
	if v == nil {
		return nvmegate.Invalid("target_id", "no target %q exists; a subsystem must be on a registered target", s.TargetID)
	}
	t, err := decodeTarget(v)
	if err != nil {
		return err
	}
	tls := false
	for i, id := range s.PortIDs {
		p, ok := t.Port(id)
		if !ok {
			return nvmegate.Invalid("port_ids["+strconv.Itoa(i)+"]", "target %q has no port %d", t.ID, id)
		}
		tls = tls || p.TLS()
		if p.SecureChannel == nvmegate.SecureChannelRequired && !s.TLS {
			// Its hosts would get no PSK, and the port takes no host
			// without TLS: no grant on it could ever connect.
			return nvmegate.Invalid("port_ids["+strconv.Itoa(i)+"]", "port %d of target %q requires TLS; a subsystem without tls cannot be served on it", id, t.ID)
		}
	}
	if s.TLS && !tls {
		return nvmegate.Invalid("tls", "a TLS subsystem needs at least one listed port with a TLS secure channel (optional or required); none of ports %v of target %q has one", s.PortIDs, t.ID)
	}
	return nil
}

// Subsystem returns the subsystem with the given NQN, or ENOTFOUND.
func (db *DB) Subsystem(ctx context.Context, nqn string) (*nvmegate.Subsystem, error) {
	return db.model.subsystem(ctx, nqn)
}

func getSubsystem(tx *bolt.Tx, nqn string) (*nvmegate.Subsystem, error) {
	v := tx.Bucket(bucketSubsystems).Get([]byte(nqn))
	if v == nil {
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "subsystem %q not found", nqn)
	}
	return decodeSubsystem(v)
}

// ListSubsystems returns subsystems in NQN order, one page at a time, and
// the token of the next page ("" after the last). With a TargetID filter
// (what the target programmer lists) it is served from the model's index of
// each target's subsystems, so it costs the size of the page, not of the
// inventory; without, it scans the file.
func (db *DB) ListSubsystems(ctx context.Context, f SubsystemFilter, page Page) ([]*nvmegate.Subsystem, string, error) {
	size, after, err := page.parse(kindSubsystems)
	if err != nil {
		return nil, "", err
	}
	match := func(s *nvmegate.Subsystem) bool {
		return (f.Tenant == "" || s.Tenant == f.Tenant) && (f.TargetID == "" || s.TargetID == f.TargetID)
	}
	var (
		items []*nvmegate.Subsystem
		next  []byte
	)
	if f.TargetID != "" {
		// The token holds an NQN: within one target the index sorts like
		// the NQNs.
		items, next, err = db.model.targetSubsystems(ctx, f.TargetID, f.Tenant, after, size)
	} else {
		err = db.view(ctx, func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketSubsystems).Cursor()
			items, next, err = scanPage(c, nil, after, size, func(_, v []byte) (*nvmegate.Subsystem, bool, []byte, error) {
				s, err := decodeSubsystem(v)
				if err != nil {
					return nil, false, nil, err
				}
				return s, match(s), nil, nil
			})
			return err
		})
	}
	if err != nil {
		return nil, "", err
	}
	return items, encodeToken(kindSubsystems, next), nil
}

// DeleteSubsystem removes a subsystem. It fails with ENOTFOUND if absent and
// with ECONFLICT while it has namespaces.
func (db *DB) DeleteSubsystem(ctx context.Context, nqn string) error {
	if ok, err := db.remote(ctx, "delete_subsystem", &deleteOp{Kind: "subsystem", ID: nqn}); ok {
		return err
	}
	return db.update(ctx, func(tx *txn) error {
		s, err := getSubsystem(tx.Tx, nqn)
		if err != nil {
			return err
		}
		prefix := namespacePrefix(nqn)
		var nsids []string
		c := tx.Bucket(bucketNamespaces).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			_, nsid, _ := splitNamespaceKey(k)
			nsids = append(nsids, "nsid "+strconv.FormatUint(uint64(nsid), 10))
		}
		if len(nsids) > 0 {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "subsystem %q still has %s; delete them first", nqn, nameSome("namespace", nsids))
		}
		if err := del(tx, bucketSubsystemsByTarget, indexKey(s.TargetID, nqn)); err != nil {
			return err
		}
		tx.record(op{del: true, subsystem: s})
		return del(tx, bucketSubsystems, []byte(nqn))
	})
}

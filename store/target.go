package store

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// TargetFilter narrows ListTargets; empty fields match everything.
type TargetFilter struct {
	Region string
	Fabric string
}

// CreateTarget stores a new target and sets its CreatedAt. It fails with the
// target's own EINVALID error, or EEXISTS if the ID is taken.
func (db *DB) CreateTarget(ctx context.Context, t *nvmegate.Target) error {
	if t == nil {
		return nvmegate.Invalid("", "a target is required")
	}
	if ok, err := db.remote(ctx, "create_target", &createOp[nvmegate.Target]{Record: t}); ok {
		return err
	}
	if err := t.Validate(); err != nil {
		return err
	}
	rec := *t
	rec.CreatedAt = db.now().UTC()
	val, err := encodeTarget(&rec)
	if err != nil {
		return err
	}
	stored, err := decodeTarget(val)
	if err != nil {
		return err
	}
	err = db.update(ctx, func(tx *txn) error {
		k := []byte(t.ID)
		if tx.Bucket(bucketTargets).Get(k) != nil {
			return nvmegate.Errorf(nvmegate.EEXISTS, "target %q already exists", t.ID)
		}
		tx.record(op{target: stored})
		return put(tx, bucketTargets, k, val)
	})
	if err != nil {
		return err
	}
	t.CreatedAt = rec.CreatedAt
	return nil
}

// Target returns the target with the given ID, or ENOTFOUND.
func (db *DB) Target(ctx context.Context, id string) (*nvmegate.Target, error) {
	return db.model.target(ctx, id)
}

// getTarget reads a target, ENOTFOUND if absent.
func getTarget(tx *bolt.Tx, id string) (*nvmegate.Target, error) {
	v := tx.Bucket(bucketTargets).Get([]byte(id))
	if v == nil {
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "target %q not found", id)
	}
	return decodeTarget(v)
}

// ListTargets returns targets in ID order, one page at a time, and the token
// of the next page ("" after the last).
func (db *DB) ListTargets(ctx context.Context, f TargetFilter, page Page) ([]*nvmegate.Target, string, error) {
	size, after, err := page.parse(kindTargets)
	if err != nil {
		return nil, "", err
	}
	var (
		items []*nvmegate.Target
		next  []byte
	)
	err = db.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketTargets).Cursor()
		items, next, err = scanPage(c, nil, after, size, func(_, v []byte) (*nvmegate.Target, bool, []byte, error) {
			t, err := decodeTarget(v)
			if err != nil {
				return nil, false, nil, err
			}
			ok := (f.Region == "" || t.Region == f.Region) && (f.Fabric == "" || t.Fabric == f.Fabric)
			return t, ok, nil, nil
		})
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return items, encodeToken(kindTargets, next), nil
}

// DeleteTarget removes a target. It fails with ENOTFOUND if absent and with
// ECONFLICT while subsystems on it exist.
func (db *DB) DeleteTarget(ctx context.Context, id string) error {
	if ok, err := db.remote(ctx, "delete_target", &deleteOp{Kind: "target", ID: id}); ok {
		return err
	}
	return db.update(ctx, func(tx *txn) error {
		k := []byte(id)
		if tx.Bucket(bucketTargets).Get(k) == nil {
			return nvmegate.Errorf(nvmegate.ENOTFOUND, "target %q not found", id)
		}
		prefix := indexPrefix(id)
		var nqns []string
		c := tx.Bucket(bucketSubsystemsByTarget).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			nqns = append(nqns, strconv.Quote(string(k[len(prefix):])))
		}
		if len(nqns) > 0 {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "target %q still exports %s; delete them first", id, nameSome("subsystem", nqns))
		}
		tx.record(op{del: true, target: &nvmegate.Target{ID: id}})
		return del(tx, bucketTargets, k)
	})
}

// nameSome names what still references a record, e.g. `2 subsystems
// ("a", "b")`, listing at most a few of the (already quoted) names.
func nameSome(noun string, names []string) string {
	const most = 3
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", len(names), noun)
	if len(names) != 1 {
		b.WriteString("s")
	}
	b.WriteString(" (")
	for i, n := range names {
		if i == most {
			fmt.Fprintf(&b, ", and %d more", len(names)-most)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n)
	}
	b.WriteString(")")
	return b.String()
}

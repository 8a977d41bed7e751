package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// checkInvariants reads the whole file and reports every broken invariant of
// doc.go: records decode and validate under their keys, references resolve,
// the tenant rule holds, and both indexes match the records exactly.
func checkInvariants(db *DB) error {
	return db.bolt.View(func(tx *bolt.Tx) error {
		var errs []error
		bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

		for _, name := range allBuckets {
			if tx.Bucket(name) == nil {
				bad("bucket %s is missing", name)
			}
		}
		if errs != nil {
			return errors.Join(errs...)
		}
		meta := tx.Bucket(bucketMeta)
		if got := string(meta.Get(metaKind)); got != storeKind {
			bad("meta kind = %q", got)
		}
		if v := meta.Get(metaSchema); len(v) != 8 || binary.BigEndian.Uint64(v) != SchemaVersion {
			bad("meta schema version = %x", v)
		}
		each := func(name []byte, fn func(k, v []byte)) {
			_ = tx.Bucket(name).ForEach(func(k, v []byte) error { fn(k, v); return nil })
		}

		each(bucketTargets, func(k, v []byte) {
			t, err := decodeTarget(v)
			switch {
			case err != nil:
				bad("target %q: %v", k, err)
			case t.ID != string(k):
				bad("target under key %q has ID %q", k, t.ID)
			default:
				if err := t.Validate(); err != nil {
					bad("target %q: %v", k, err)
				}
			}
		})

		subs := map[string]*nvmegate.Subsystem{}
		each(bucketSubsystems, func(k, v []byte) {
			s, err := decodeSubsystem(v)
			switch {
			case err != nil:
				bad("subsystem %q: %v", k, err)
				return
			case s.NQN != string(k):
				bad("subsystem under key %q has NQN %q", k, s.NQN)
				return
			}
			subs[s.NQN] = s
			if err := s.Validate(); err != nil {
				bad("subsystem %q: %v", k, err)
			}
			if err := checkSubsystemPorts(tx, s); err != nil {
				bad("subsystem %q: %v", k, err)
			}
			if tx.Bucket(bucketSubsystemsByTarget).Get(indexKey(s.TargetID, s.NQN)) == nil {
				bad("subsystem %q: no %s entry", k, bucketSubsystemsByTarget)
			}
		})
		each(bucketSubsystemsByTarget, func(k, v []byte) {
			target, nqn, ok := bytes.Cut(k, []byte{keySep})
			s := subs[string(nqn)]
			switch {
			case !ok:
				bad("%s key %q has no separator", bucketSubsystemsByTarget, k)
			case s == nil:
				bad("%s entry %q: no subsystem %q", bucketSubsystemsByTarget, k, nqn)
			case s.TargetID != string(target):
				bad("%s entry %q: subsystem is on target %q", bucketSubsystemsByTarget, k, s.TargetID)
			case len(v) != 0:
				bad("%s entry %q has a value", bucketSubsystemsByTarget, k)
			}
		})

		each(bucketNamespaces, func(k, v []byte) {
			n, err := decodeNamespace(v)
			switch {
			case err != nil:
				bad("namespace %q: %v", k, err)
				return
			case !bytes.Equal(k, namespaceKey(n.SubsystemNQN, n.NSID)):
				bad("namespace under key %q is %s/%d", k, n.SubsystemNQN, n.NSID)
				return
			}
			if err := n.Validate(); err != nil {
				bad("namespace %q: %v", k, err)
			}
			switch s := subs[n.SubsystemNQN]; {
			case s == nil:
				bad("namespace %s/%d: no subsystem", n.SubsystemNQN, n.NSID)
			case s.Tenant != n.Tenant:
				bad("namespace %s/%d: tenant %q, subsystem tenant %q", n.SubsystemNQN, n.NSID, n.Tenant, s.Tenant)
			}
		})

		byNQN := tx.Bucket(bucketHostBindingsByNQN)
		bindings := map[string]*nvmegate.HostBinding{}
		each(bucketHostBindings, func(k, v []byte) {
			h, err := decodeHostBinding(v)
			switch {
			case err != nil:
				bad("host binding %q: %v", k, err)
				return
			case h.SPIFFEID != string(k):
				bad("host binding under key %q has SPIFFE ID %q", k, h.SPIFFEID)
				return
			}
			bindings[h.SPIFFEID] = h
			// Older versions stored host NQNs in any case: canonical
			// apart from that.
			canon := nvmegate.CanonicalNQN(h.HostNQN)
			valid := *h
			valid.HostNQN = canon
			if err := valid.Validate(); err != nil {
				bad("host binding %q: %v", k, err)
			}
			owner := byNQN.Get([]byte(canon))
			sharing := byNQN.Get(indexKey(canon, h.SPIFFEID))
			switch {
			case string(owner) == h.SPIFFEID && sharing == nil:
			case owner != nil && string(sharing) == h.SPIFFEID:
				// Shares the NQN with the binding that holds it, as an
				// older file's migration left it (canonicalizeHostIndex).
			default:
				bad("host binding %q: index maps its host NQN %q to %q (and to %q as sharing it)", k, canon, owner, sharing)
			}
		})
		each(bucketHostBindingsByNQN, func(k, v []byte) {
			canon, id, sharing := bytes.Cut(k, []byte{keySep})
			h := bindings[string(v)]
			switch {
			case h == nil || nvmegate.CanonicalNQN(h.HostNQN) != string(canon) || nvmegate.CanonicalNQN(string(canon)) != string(canon):
				bad("%s entry %q -> %q has no matching binding", bucketHostBindingsByNQN, k, v)
			case sharing && (string(id) != string(v) || byNQN.Get(canon) == nil || string(byNQN.Get(canon)) == string(v)):
				bad("%s entry %q -> %q shares an NQN nobody else holds", bucketHostBindingsByNQN, k, v)
			}
		})

		// Active grants: one grants_by_host entry each, and one host NQN
		// (canonically) is one identity's: the node it is bound to, if
		// any, holds every active grant on it.
		hostKeys := map[string]bool{}
		holder := map[string]string{} // canonical host NQN -> node
		each(bucketGrants, func(k, v []byte) {
			g, err := decodeGrant(v)
			if err != nil {
				bad("grant %q: %v", k, err)
				return
			}
			// Pending removal is indexed exactly for the ended grants
			// pending it; a superseded grant waits on its successor.
			pending := tx.Bucket(bucketGrantsPending).Get(k) != nil
			if want := g.State != nvmegate.GrantActive && g.RemovalPending; pending != want {
				bad("grant %q (%s, pending %v): %s entry %v", k, g.State, g.RemovalPending, bucketGrantsPending, pending)
			}
			if g.SupersededBy != "" && tx.Bucket(bucketGrantsSuperseded).Get(supersededKey(g.SupersededBy, g.ID)) == nil {
				bad("grant %q superseded by %s: no %s entry", k, g.SupersededBy, bucketGrantsSuperseded)
			}
			if g.State != nvmegate.GrantActive {
				return
			}
			hk := grantByHostKey(g.HostNQN, g.Node, g.ID)
			hostKeys[string(hk)] = true
			if tx.Bucket(bucketGrantsByHost).Get(hk) == nil {
				bad("grant %q: no %s entry", k, bucketGrantsByHost)
			}
			canon := nvmegate.CanonicalNQN(g.HostNQN)
			if owner := byNQN.Get([]byte(canon)); owner != nil && string(owner) != g.Node {
				bad("grant %q of %s: its host NQN %q is bound to %s", k, g.Node, g.HostNQN, owner)
			}
			if n, ok := holder[canon]; ok && n != g.Node {
				bad("grant %q of %s: host NQN %q has active grants of %s too", k, g.Node, g.HostNQN, n)
			}
			holder[canon] = g.Node
		})
		each(bucketGrantsSuperseded, func(k, _ []byte) {
			succ, id, _ := bytes.Cut(k, []byte{0})
			v := tx.Bucket(bucketGrants).Get(id)
			if v == nil {
				bad("%s entry %q names no grant", bucketGrantsSuperseded, k)
				return
			}
			if g, err := decodeGrant(v); err == nil && (g.State != nvmegate.GrantReleased || g.SupersededBy != string(succ)) {
				bad("%s entry %q: the grant is %s, superseded by %q", bucketGrantsSuperseded, k, g.State, g.SupersededBy)
			}
		})
		each(bucketGrantsByHost, func(k, v []byte) {
			if !hostKeys[string(k)] || len(v) != 0 {
				bad("%s entry %q names no active grant", bucketGrantsByHost, k)
			}
		})
		return errors.Join(errs...)
	})
}

// TestCheckInvariantsCatches breaks each invariant behind the store's back
// and expects the checker used after every test to notice.
func TestCheckInvariantsCatches(t *testing.T) {
	ctx := context.Background()
	for name, tamper := range map[string]func(*bolt.Tx) error{
		"namespace of another tenant": func(tx *bolt.Tx) error {
			v, err := encodeNamespace(newNamespace(subNQN(0), 9, "globex"))
			if err != nil {
				return err
			}
			return tx.Bucket(bucketNamespaces).Put(namespaceKey(subNQN(0), 9), v)
		},
		"namespace without subsystem": func(tx *bolt.Tx) error {
			v, err := encodeNamespace(newNamespace(subNQN(5), 1, "acme"))
			if err != nil {
				return err
			}
			return tx.Bucket(bucketNamespaces).Put(namespaceKey(subNQN(5), 1), v)
		},
		"missing target index entry": func(tx *bolt.Tx) error {
			return tx.Bucket(bucketSubsystemsByTarget).Delete(indexKey("t1", subNQN(0)))
		},
		"stale target index entry": func(tx *bolt.Tx) error {
			return tx.Bucket(bucketSubsystemsByTarget).Put(indexKey("t1", subNQN(7)), nil)
		},
		"missing host NQN index entry": func(tx *bolt.Tx) error {
			return tx.Bucket(bucketHostBindingsByNQN).Delete([]byte(hostNQN(1)))
		},
		"host NQN index entry not canonical": func(tx *bolt.Tx) error {
			if err := tx.Bucket(bucketHostBindingsByNQN).Delete([]byte(hostNQN(1))); err != nil {
				return err
			}
			return tx.Bucket(bucketHostBindingsByNQN).Put([]byte(strings.Replace(hostNQN(1), "org.nvmexpress", "ORG.NVMEXPRESS", 1)), []byte(nodeID(1)))
		},
		"missing grant host index entry": func(tx *bolt.Tx) error {
			return tx.Bucket(bucketGrantsByHost).Delete(grantByHostKey(hostNQN(2), nodeID(2), "grant-0002"))
		},
		"stale grant host index entry": func(tx *bolt.Tx) error {
			return tx.Bucket(bucketGrantsByHost).Put(grantByHostKey(hostNQN(3), nodeID(3), "grant-0003"), nil)
		},
		"grant on a host NQN bound to another identity": func(tx *bolt.Tx) error {
			h := newBinding(3, "")
			h.HostNQN = hostNQN(2)
			v, err := encodeHostBinding(h)
			if err != nil {
				return err
			}
			if err := tx.Bucket(bucketHostBindings).Put([]byte(h.SPIFFEID), v); err != nil {
				return err
			}
			return tx.Bucket(bucketHostBindingsByNQN).Put([]byte(h.HostNQN), []byte(h.SPIFFEID))
		},
		"active grants of two nodes on one host NQN": func(tx *bolt.Tx) error {
			g := newGrant(4, subNQN(0))
			g.HostNQN = strings.Replace(hostNQN(2), "org.nvmexpress", "ORG.nvmexpress", 1) // canonically the same
			v, err := encodeGrant(g)
			if err != nil {
				return err
			}
			if err := tx.Bucket(bucketGrants).Put([]byte(g.ID), v); err != nil {
				return err
			}
			return tx.Bucket(bucketGrantsByHost).Put(grantByHostKey(g.HostNQN, g.Node, g.ID), nil)
		},
		"dangling host NQN index entry": func(tx *bolt.Tx) error {
			return tx.Bucket(bucketHostBindingsByNQN).Put([]byte(hostNQN(8)), []byte(nodeID(8)))
		},
		"record under the wrong key": func(tx *bolt.Tx) error {
			return tx.Bucket(bucketTargets).Put([]byte("t2"), tx.Bucket(bucketTargets).Get([]byte("t1")))
		},
	} {
		t.Run(name, func(t *testing.T) {
			db := openPath(t, filepath.Join(t.TempDir(), "store.db"))
			defer db.Close()
			inventory(t, db, "acme")
			must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
			must(t, db.CreateHostBinding(ctx, newBinding(1, "")))
			must(t, db.PutGrant(ctx, newGrant(2, subNQN(0))))
			must(t, checkInvariants(db))
			must(t, db.bolt.Update(tamper))
			if err := checkInvariants(db); err == nil {
				t.Error("checker found nothing")
			}
		})
	}
}

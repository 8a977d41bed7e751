package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate"
)

// The reads served from the model. Each holds the read lock for the whole
// read, so it sees one revision, and returns copies: a caller may modify
// what it gets without touching the model (but for a job's slices, see
// DB.Job). Errors are those the same read of the file returned.

func (m *model) target(ctx context.Context, id string) (*nvmegate.Target, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	t, ok := m.targets[id]
	if !ok {
		return nil, m.notFound(bucketTargets, id, "target %q not found", id)
	}
	c := *t
	c.Ports = slices.Clone(t.Ports)
	return &c, nil
}

func (m *model) subsystem(ctx context.Context, nqn string) (*nvmegate.Subsystem, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	s, ok := m.subsystems[nqn]
	if !ok {
		return nil, m.notFound(bucketSubsystems, nqn, "subsystem %q not found", nqn)
	}
	return copySubsystem(s), nil
}

func copySubsystem(s *nvmegate.Subsystem) *nvmegate.Subsystem {
	c := *s
	c.PortIDs = slices.Clone(s.PortIDs)
	return &c
}

func (m *model) namespace(ctx context.Context, nqn string, nsid uint32) (*nvmegate.Namespace, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	n, ok := m.namespaces[nsKey{nqn, nsid}]
	if !ok {
		if err := m.corruptErr(bucketNamespaces, string(namespaceKey(nqn, nsid))); err != nil {
			return nil, err
		}
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "namespace %d of subsystem %q not found", nsid, nqn)
	}
	c := *n
	return &c, nil
}

func (m *model) hostBinding(ctx context.Context, spiffeID string) (*nvmegate.HostBinding, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	h, ok := m.bindings[spiffeID]
	if !ok {
		return nil, m.notFound(bucketHostBindings, spiffeID, "host binding for %q not found", spiffeID)
	}
	c := *h
	return &c, nil
}

// hostBindingByNQN looks hostNQN up in canonical form and cross-checks the
// index entry and the binding: an inconsistent index is an internal error,
// never an answer.
func (m *model) hostBindingByNQN(ctx context.Context, hostNQN string) (*nvmegate.HostBinding, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	canon := nvmegate.CanonicalNQN(hostNQN)
	id, ok := m.bindingByNQN[canon]
	if !ok {
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "host NQN %q is not bound", hostNQN)
	}
	h, ok := m.bindings[id]
	switch {
	case !ok:
		if err := m.corruptErr(bucketHostBindings, id); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("store: index %s: host NQN %q points to missing binding %q", bucketHostBindingsByNQN, hostNQN, id)
	case nvmegate.CanonicalNQN(h.HostNQN) != canon || h.SPIFFEID != id:
		return nil, fmt.Errorf("store: index %s: host NQN %q points to binding %q of host NQN %q", bucketHostBindingsByNQN, hostNQN, id, h.HostNQN)
	}
	c := *h
	return &c, nil
}

// job returns a copy of the job whose slices are the model's (clipped):
// an active job, or an ended one it keeps (endedJobs). ok is false for
// any other: the caller reads the file.
func (m *model) job(ctx context.Context, id string) (j *nvmegate.Job, ok bool, err error) {
	if err := m.rlock(ctx); err != nil {
		return nil, false, err
	}
	defer m.mu.RUnlock()
	if err := m.corruptErr(bucketJobs, id); err != nil {
		return nil, true, err
	}
	if j, ok = m.jobs[id]; !ok {
		if j = m.ended.get(id); j == nil {
			return nil, false, nil
		}
	}
	c := *j
	return &c, true, nil
}

// activeGrant returns grant id if it is in the model (active); ok is false
// if it is not, and the caller reads the file.
func (m *model) activeGrant(ctx context.Context, id string) (g *nvmegate.Grant, ok bool, err error) {
	if err := m.rlock(ctx); err != nil {
		return nil, false, err
	}
	defer m.mu.RUnlock()
	if err := m.corruptErr(bucketGrants, id); err != nil {
		return nil, true, err
	}
	stored, ok := m.grants[id]
	if !ok {
		return nil, false, nil
	}
	c := *stored
	return &c, true, nil
}

// subsystemGrants returns the active grants of a subsystem in ID order,
// copied into one array.
func (m *model) subsystemGrants(ctx context.Context, nqn string) ([]*nvmegate.Grant, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	gs, err := m.grantsByID(bucketGrantsBySubsystem, m.grantsBySub[nqn], func(id string) string { return id }, true)
	m.mu.RUnlock()
	return copyGrants(gs), err
}

// activeGrants returns every active grant, by subsystem and grant ID.
func (m *model) activeGrants(ctx context.Context) ([]*nvmegate.Grant, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	var out []*nvmegate.Grant
	for _, sub := range slices.Sorted(maps.Keys(m.grantsBySub)) {
		gs, err := m.grantsByID(bucketGrantsBySubsystem, m.grantsBySub[sub], func(id string) string { return id }, true)
		if err != nil {
			m.mu.RUnlock()
			return nil, err
		}
		out = append(out, gs...)
	}
	m.mu.RUnlock()
	return copyGrants(out), nil
}

// nodeGrants returns the active grants of a node whose node index entry
// (job 0x00 subsystem NQN 0x00 grant ID) starts with prefix.
func (m *model) nodeGrants(ctx context.Context, node, prefix string) ([]*nvmegate.Grant, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	keys := m.grantsByNode[node]
	if prefix != "" {
		i, _ := slices.BinarySearch(keys, prefix)
		n := 0
		for n < len(keys)-i && strings.HasPrefix(keys[i+n], prefix) {
			n++
		}
		keys = keys[i : i+n]
	}
	gs, err := m.grantsByID(bucketGrantsByNode, keys, func(k string) string { return k[strings.LastIndexByte(k, keySep)+1:] }, false)
	m.mu.RUnlock()
	return copyGrants(gs), err
}

// grantsByID returns the model's grants named by index entries keys (id
// extracts the grant ID), failing on an entry without its grant;
// activeOnly skips grants not stored as active (the index holds none).
// The caller copies them (copyGrants), after releasing the lock if it
// likes: stored values are never modified.
func (m *model) grantsByID(index []byte, keys []string, id func(string) string, activeOnly bool) ([]*nvmegate.Grant, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	out := make([]*nvmegate.Grant, 0, len(keys))
	for _, k := range keys {
		g, ok := m.grants[id(k)]
		if !ok {
			if err := m.corruptErr(bucketGrants, id(k)); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("store: index %s points to a missing grant %q", index, id(k))
		}
		if !activeOnly || g.State == nvmegate.GrantActive {
			out = append(out, g)
		}
	}
	return out, nil
}

// copyGrants replaces the model's grants in gs by copies, all in one
// array; nil if there are none.
func copyGrants(gs []*nvmegate.Grant) []*nvmegate.Grant {
	if len(gs) == 0 {
		return nil
	}
	buf := make([]nvmegate.Grant, len(gs))
	for i, g := range gs {
		buf[i] = *g
		gs[i] = &buf[i]
	}
	return gs
}

// expiredGrants returns the grants stored as active whose expiry is not
// after now, in the order of the grants_by_subsystem index.
func (m *model) pendingRemovals(ctx context.Context) ([]*nvmegate.Grant, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	out := make([]*nvmegate.Grant, 0, len(m.pending))
	for _, id := range slices.Sorted(maps.Keys(m.pending)) {
		c := *m.pending[id]
		out = append(out, &c)
	}
	return out, nil
}

func (m *model) pendingRemovalCount() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.pending)
}

func (m *model) expiredGrants(ctx context.Context, now time.Time) ([]*nvmegate.Grant, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	var out []*nvmegate.Grant
	for _, sub := range slices.Sorted(maps.Keys(m.grantsBySub)) {
		for _, id := range m.grantsBySub[sub] {
			g, ok := m.grants[id]
			if !ok {
				if err := m.corruptErr(bucketGrants, id); err != nil {
					return nil, err
				}
				return nil, fmt.Errorf("store: index %s points to a missing grant %q", bucketGrantsBySubsystem, id)
			}
			if g.State == nvmegate.GrantActive && (!now.Before(g.ExpiresAt) || !g.ReauthBy.IsZero() && !now.Before(g.ReauthBy)) {
				c := *g
				out = append(out, &c)
			}
		}
	}
	return out, nil
}

// targetSubsystems is ListSubsystems with a TargetID filter: the target's
// subsystems with NQNs after after, of tenant (any if ""), up to size, and
// the NQN of the last one returned if more follow (else nil).
func (m *model) targetSubsystems(ctx context.Context, target, tenant string, after []byte, size int) ([]*nvmegate.Subsystem, []byte, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, nil, err
	}
	defer m.mu.RUnlock()
	nqns := m.subsByTarget[target]
	start := sort.Search(len(nqns), func(i int) bool { return nqns[i] > string(after) })
	items, last, more, err := pageOf(nqns[start:], size, func(nqn string) (*nvmegate.Subsystem, bool, error) {
		s, ok := m.subsystems[nqn]
		if !ok {
			if err := m.corruptErr(bucketSubsystems, nqn); err != nil {
				return nil, false, err
			}
			return nil, false, fmt.Errorf("store: index %s: subsystem %q of target %q is missing", bucketSubsystemsByTarget, nqn, target)
		}
		if (tenant != "" && s.Tenant != tenant) || s.TargetID != target {
			return nil, false, nil
		}
		return copySubsystem(s), true, nil
	})
	if err != nil || !more {
		return items, nil, err
	}
	return items, []byte(last), nil
}

// subsystemNamespaces is ListNamespaces with a SubsystemNQN filter: the
// subsystem's namespaces whose key is after after, matching tenant and
// region ("" matches any), up to size, and the key of the last one
// returned if more follow (else nil).
func (m *model) subsystemNamespaces(ctx context.Context, nqn, tenant, region string, after []byte, size int) ([]*nvmegate.Namespace, []byte, error) {
	if err := m.rlock(ctx); err != nil {
		return nil, nil, err
	}
	defer m.mu.RUnlock()
	nsids := m.nsBySub[nqn]
	start := 0
	if after != nil {
		// The first key after the token's, compared as keys (a token may
		// name a key of another subsystem, before or after this one).
		k := namespaceKey(nqn, 0)
		start = sort.Search(len(nsids), func(i int) bool {
			return bytes.Compare(namespaceKeyInto(k, nsids[i]), after) > 0
		})
	}
	items, last, more, err := pageOf(nsids[start:], size, func(nsid uint32) (*nvmegate.Namespace, bool, error) {
		n, ok := m.namespaces[nsKey{nqn, nsid}]
		if !ok {
			return nil, false, m.corruptErr(bucketNamespaces, string(namespaceKey(nqn, nsid)))
		}
		if (tenant != "" && n.Tenant != tenant) || (region != "" && n.Region != region) {
			return nil, false, nil
		}
		c := *n
		return &c, true, nil
	})
	if err != nil || !more {
		return items, nil, err
	}
	return items, namespaceKey(nqn, last), nil
}

// pageOf is scanPage over keys already positioned: up to size matches of
// get, the key of the last one, and whether another match follows.
func pageOf[K, T any](keys []K, size int, get func(K) (T, bool, error)) (items []T, last K, more bool, err error) {
	items = make([]T, 0, min(size, len(keys)))
	for _, k := range keys {
		item, ok, err := get(k)
		switch {
		case err != nil:
			return nil, last, false, err
		case !ok:
			continue
		case len(items) == size:
			return items, last, true, nil
		}
		items = append(items, item)
		last = k
	}
	return items, last, false, nil
}

// notFound is the error for a key the model does not hold: its decode
// error if the record is corrupt, else ENOTFOUND.
func (m *model) notFound(bucket []byte, key string, format string, args ...any) error {
	if err := m.corruptErr(bucket, key); err != nil {
		return err
	}
	return nvmegate.Errorf(nvmegate.ENOTFOUND, format, args...)
}

// namespaceKeyInto sets the NSID of namespace key k (namespaceKey's shape).
func namespaceKeyInto(k []byte, nsid uint32) []byte {
	binary.BigEndian.PutUint32(k[len(k)-4:], nsid)
	return k
}

package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate"
)

// model is the in-memory read model: the decoded records the hot path
// reads (the inventory, every job, the active grants) and the indexes it
// reads them by. It is loaded from the file once, at Open, and from then on
// changes only by apply, with the change a write transaction made, after
// that transaction committed. Readers hold mu for reading and see either
// all of a change or none of it.
//
// The model knows nothing of bbolt but load: a store replicated through
// etcd can fill it from a snapshot and feed it the changes a watch reports.
type model struct {
	mu     sync.RWMutex
	closed bool
	rev    atomic.Uint64 // of the last change applied; stored under mu
	// scopeRev is the revision of the last change to anything but grants.
	scopeRev atomic.Uint64
	records
	// feeds hear of every scope change applied (DB.WatchScope).
	feeds []*ScopeFeed
	// onPolicy hears of each policy a change loads, once the model
	// serves it (Options.PolicyLoaded); onRoot of each access root
	// rotation a change notes (Options.RootRotated).
	onPolicy func(*Policy)
	onRoot   func(*RootRotation)
}

// records are the model's maps. Values are never modified once stored: a
// change replaces them, and readers hand out copies. A reader may
// therefore collect values under the lock and copy them after releasing
// it, which keeps a large read (SubsystemGrants) from holding up commits.
type records struct {
	targets      map[string]*nvmegate.Target
	subsystems   map[string]*nvmegate.Subsystem
	subsByTarget map[string][]string // target ID -> subsystem NQNs, ascending
	namespaces   map[nsKey]*nvmegate.Namespace
	nsBySub      map[string][]uint32 // subsystem NQN -> NSIDs, ascending
	bindings     map[string]*nvmegate.HostBinding
	bindingByNQN map[string]string // canonical host NQN -> SPIFFE ID
	// jobs holds the active jobs (a job of 10,000 nodes is a large
	// record, and a gateway admits jobs for as long as it runs); ended
	// ones are read from the file, the few read or ended last kept in
	// ended.
	jobs  map[string]*nvmegate.Job
	ended *endedJobs
	// jobNodes is each active job's node set: a grant's commit asks
	// whether its node is still in its job (a job's nodes can change).
	jobNodes map[string]map[string]struct{}
	// grants holds the active grants (those in the indexes); ended grants
	// are read from the file.
	grants      map[string]*nvmegate.Grant
	grantsBySub map[string][]string // subsystem NQN -> grant IDs, ascending
	// grantsByNode maps a node to "job 0x00 subsystem NQN 0x00 grant ID"
	// of its grants, ascending (the order of the grants_by_node keys).
	grantsByNode map[string][]string
	// pending holds the ended grants whose removal is not acknowledged
	// (the grants_removal_pending index): few, and read by every sweep.
	pending map[string]*nvmegate.Grant

	// policy is the policy in force (nil: none loaded through the store).
	policy *Policy

	// corrupt holds the records that did not decode at load, by bucket and
	// key: a read that reaches one fails with its decode error, as it did
	// when every read decoded the file. Normally empty.
	corrupt map[recordKey]error
}

type nsKey struct {
	nqn  string
	nsid uint32
}

type recordKey struct{ bucket, key string }

func newRecords() records {
	return records{
		targets: map[string]*nvmegate.Target{}, subsystems: map[string]*nvmegate.Subsystem{},
		subsByTarget: map[string][]string{}, namespaces: map[nsKey]*nvmegate.Namespace{},
		nsBySub: map[string][]uint32{}, bindings: map[string]*nvmegate.HostBinding{},
		bindingByNQN: map[string]string{}, jobs: map[string]*nvmegate.Job{}, ended: &endedJobs{}, jobNodes: map[string]map[string]struct{}{},
		grants: map[string]*nvmegate.Grant{}, grantsBySub: map[string][]string{},
		grantsByNode: map[string][]string{}, pending: map[string]*nvmegate.Grant{}, corrupt: map[recordKey]error{},
	}
}

// A change is what one committed write transaction did to the records the
// model holds, in order. Revision numbers it: each change has a larger one
// than the change before.
type change struct {
	revision uint64
	ops      []op
}

// An op is one record written (put) or removed (del). Exactly one record
// field is set; the model keeps the value, so it must be the writer's own
// decoded copy of what it stored, shared with no caller. A deleted target
// or namespace needs only its key fields; a deleted subsystem or host
// binding is the record as it was (its index entry goes with it). Grants
// are never deleted: an ended grant leaves the model's indexes.
type op struct {
	del       bool
	target    *nvmegate.Target
	subsystem *nvmegate.Subsystem
	namespace *nvmegate.Namespace
	binding   *nvmegate.HostBinding
	job       *nvmegate.Job
	grant     *nvmegate.Grant
	policy    *Policy
	root      *RootRotation
}

// apply makes c visible to readers, all at once.
func (m *model) apply(c change) {
	// The hooks hear of a change before the revision moves: a call that
	// waits for this revision (a replica's read barrier, read your
	// writes) then finds the engine and the roots of its result.
	for _, o := range c.ops {
		switch {
		case o.policy != nil && m.onPolicy != nil:
			m.onPolicy(o.policy)
		case o.root != nil && m.onRoot != nil:
			m.onRoot(o.root)
		}
	}
	m.applyLocked(c)
}

// applyLocked is apply under the lock.
func (m *model) applyLocked(c change) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.revision <= m.rev.Load() {
		panic(fmt.Sprintf("store: change of revision %d applied after revision %d", c.revision, m.rev.Load()))
	}
	scope := false
	for _, o := range c.ops {
		m.records.apply(o)
		scope = scope || o.grant == nil && o.root == nil // a root rotation changes no scope
	}
	if scope {
		m.scopeRev.Store(c.revision)
		for _, f := range m.feeds {
			f.add(c.revision, c.ops)
		}
	}
	m.rev.Store(c.revision)
}

func (r *records) apply(o op) {
	switch {
	case o.target != nil:
		t := o.target
		r.clean(bucketTargets, t.ID)
		if o.del {
			delete(r.targets, t.ID)
		} else {
			r.targets[t.ID] = t
		}
	case o.subsystem != nil:
		s := o.subsystem
		r.clean(bucketSubsystems, s.NQN)
		if o.del {
			delete(r.subsystems, s.NQN)
			removeSorted(r.subsByTarget, s.TargetID, s.NQN)
		} else {
			r.subsystems[s.NQN] = s
			insertSorted(r.subsByTarget, s.TargetID, s.NQN)
		}
	case o.namespace != nil:
		n := o.namespace
		if len(r.corrupt) > 0 {
			r.clean(bucketNamespaces, string(namespaceKey(n.SubsystemNQN, n.NSID)))
		}
		if o.del {
			delete(r.namespaces, nsKey{n.SubsystemNQN, n.NSID})
			removeSorted(r.nsBySub, n.SubsystemNQN, n.NSID)
		} else {
			r.namespaces[nsKey{n.SubsystemNQN, n.NSID}] = n
			insertSorted(r.nsBySub, n.SubsystemNQN, n.NSID)
		}
	case o.binding != nil:
		h := o.binding
		r.clean(bucketHostBindings, h.SPIFFEID)
		canon := nvmegate.CanonicalNQN(h.HostNQN)
		if o.del {
			delete(r.bindings, h.SPIFFEID)
			if r.bindingByNQN[canon] == h.SPIFFEID { // not one sharing it (canonicalizeHostIndex)
				delete(r.bindingByNQN, canon)
			}
		} else {
			r.bindings[h.SPIFFEID] = h
			r.bindingByNQN[canon] = h.SPIFFEID
		}
	case o.job != nil:
		r.clean(bucketJobs, o.job.ID)
		if o.job.State == nvmegate.JobActive {
			r.jobs[o.job.ID] = o.job
			r.ended.drop(o.job.ID)
			set := make(map[string]struct{}, len(o.job.Nodes))
			for _, n := range o.job.Nodes {
				set[n] = struct{}{}
			}
			r.jobNodes[o.job.ID] = set
		} else {
			delete(r.jobs, o.job.ID)
			delete(r.jobNodes, o.job.ID)
			r.ended.put(o.job)
		}
	case o.policy != nil:
		r.policy = o.policy
	case o.grant != nil:
		g := o.grant
		r.clean(bucketGrants, g.ID)
		byNode := g.JobID + "\x00" + g.SubsystemNQN + "\x00" + g.ID
		if g.State == nvmegate.GrantActive {
			r.grants[g.ID] = g
			insertSorted(r.grantsBySub, g.SubsystemNQN, g.ID)
			insertSorted(r.grantsByNode, g.Node, byNode)
		} else {
			delete(r.grants, g.ID)
			removeSorted(r.grantsBySub, g.SubsystemNQN, g.ID)
			removeSorted(r.grantsByNode, g.Node, byNode)
		}
		if g.RemovalPending && g.State != nvmegate.GrantActive {
			r.pending[g.ID] = g
		} else {
			delete(r.pending, g.ID)
		}
	}
}

// clean forgets a corrupt record that a write replaced or removed.
func (r *records) clean(bucket []byte, key string) {
	if len(r.corrupt) > 0 {
		delete(r.corrupt, recordKey{string(bucket), key})
	}
}

// corruptErr is the decode error of the record at bucket, key, if it is
// corrupt.
func (r *records) corruptErr(bucket []byte, key string) error {
	if len(r.corrupt) == 0 {
		return nil
	}
	return r.corrupt[recordKey{string(bucket), key}]
}

func insertSorted[V cmp.Ordered](idx map[string][]V, k string, v V) {
	s := idx[k]
	if i, found := slices.BinarySearch(s, v); !found {
		idx[k] = slices.Insert(s, i, v)
	}
}

func removeSorted[V cmp.Ordered](idx map[string][]V, k string, v V) {
	s := idx[k]
	i, found := slices.BinarySearch(s, v)
	switch {
	case !found:
	case len(s) == 1:
		delete(idx, k)
	default:
		idx[k] = slices.Delete(s, i, i+1)
	}
}

// rlock takes the read lock for one read, or fails without it for a
// canceled call or a closed store.
func (m *model) rlock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (m *model) close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
}

// load reads the model's records from the file, and the revision of its
// last commit. The indexes are loaded from their buckets, not rebuilt
// from the records, so that reads report a damaged index as they did when
// they walked it. A record that does not decode is kept as its error
// (records.corrupt); a malformed index key fails the load.
func load(tx *bolt.Tx) (records, uint64, error) {
	r := newRecords()
	var rev uint64
	if v := tx.Bucket(bucketMeta).Get(metaRevision); v != nil {
		if len(v) != 8 {
			return r, 0, fmt.Errorf("store: corrupt revision (%d bytes)", len(v))
		}
		rev = binary.BigEndian.Uint64(v)
	}
	bad := func(bucket, k []byte, err error) {
		r.corrupt[recordKey{string(bucket), string(k)}] = err
	}
	err := tx.Bucket(bucketTargets).ForEach(func(k, v []byte) error {
		t, err := decodeTarget(v)
		if err != nil {
			bad(bucketTargets, k, err)
		} else {
			r.targets[string(k)] = t
		}
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketSubsystems).ForEach(func(k, v []byte) error {
		s, err := decodeSubsystem(v)
		if err != nil {
			bad(bucketSubsystems, k, err)
		} else {
			r.subsystems[string(k)] = s
		}
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketSubsystemsByTarget).ForEach(func(k, _ []byte) error {
		target, nqn, ok := bytes.Cut(k, []byte{keySep})
		if !ok {
			return fmt.Errorf("store: malformed key %q in %s", k, bucketSubsystemsByTarget)
		}
		r.subsByTarget[string(target)] = append(r.subsByTarget[string(target)], string(nqn))
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketNamespaces).ForEach(func(k, v []byte) error {
		nqn, nsid, ok := splitNamespaceKey(k)
		if !ok {
			return fmt.Errorf("store: malformed key %q in %s", k, bucketNamespaces)
		}
		r.nsBySub[nqn] = append(r.nsBySub[nqn], nsid)
		n, err := decodeNamespace(v)
		if err != nil {
			bad(bucketNamespaces, k, err)
		} else {
			r.namespaces[nsKey{nqn, nsid}] = n
		}
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketHostBindings).ForEach(func(k, v []byte) error {
		h, err := decodeHostBinding(v)
		if err != nil {
			bad(bucketHostBindings, k, err)
		} else {
			r.bindings[string(k)] = h
		}
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketHostBindingsByNQN).ForEach(func(k, v []byte) error {
		if bytes.IndexByte(k, keySep) < 0 { // not one sharing the NQN (canonicalizeHostIndex)
			r.bindingByNQN[string(k)] = string(v)
		}
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
		j, err := decodeJob(v)
		switch {
		case err != nil:
			bad(bucketJobs, k, err)
		case j.State == nvmegate.JobActive:
			r.apply(op{job: clipJob(j)})
		}
		return nil
	})
	if err != nil {
		return r, 0, err
	}

	// The grants the two indexes name, each decoded once; an index entry
	// whose grant is missing stays, and reads through it fail as before.
	grants := tx.Bucket(bucketGrants)
	loadGrant := func(id []byte) {
		if _, ok := r.grants[string(id)]; ok {
			return
		}
		if _, ok := r.corrupt[recordKey{string(bucketGrants), string(id)}]; ok {
			return
		}
		v := grants.Get(id)
		if v == nil {
			return
		}
		if g, err := decodeGrant(v); err != nil {
			bad(bucketGrants, id, err)
		} else {
			r.grants[string(id)] = g
		}
	}
	err = tx.Bucket(bucketGrantsBySubsystem).ForEach(func(k, _ []byte) error {
		sub, id, ok := bytes.Cut(k, []byte{keySep})
		if !ok {
			return fmt.Errorf("store: malformed key %q in %s", k, bucketGrantsBySubsystem)
		}
		r.grantsBySub[string(sub)] = append(r.grantsBySub[string(sub)], string(id))
		loadGrant(id)
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketGrantsPending).ForEach(func(id, _ []byte) error {
		v := grants.Get(id)
		if v == nil {
			return fmt.Errorf("store: index %s points to a missing grant %q", bucketGrantsPending, id)
		}
		g, err := decodeGrant(v)
		if err != nil {
			bad(bucketGrants, id, err)
		} else {
			r.pending[string(id)] = g
		}
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	err = tx.Bucket(bucketGrantsByNode).ForEach(func(k, _ []byte) error {
		node, rest, ok := bytes.Cut(k, []byte{keySep})
		if !ok || bytes.Count(rest, []byte{keySep}) != 2 {
			return fmt.Errorf("store: malformed key %q in %s", k, bucketGrantsByNode)
		}
		r.grantsByNode[string(node)] = append(r.grantsByNode[string(node)], string(rest))
		loadGrant(rest[bytes.LastIndexByte(rest, keySep)+1:])
		return nil
	})
	if err != nil {
		return r, 0, err
	}
	if b := tx.Bucket(bucketPolicy); b != nil {
		if v := b.Get(policyActive); v != nil {
			if r.policy, err = decodePolicy(v); err != nil {
				return r, 0, err
			}
		}
	}
	return r, rev, nil
}

// clipJob clips a job's slices: readers share them (DB.Job), and an
// append by one must not write into the model's array.
func clipJob(j *nvmegate.Job) *nvmegate.Job {
	j.Nodes, j.AllowedRegions, j.Namespaces = slices.Clip(j.Nodes), slices.Clip(j.AllowedRegions), slices.Clip(j.Namespaces)
	return j
}

// endedJobs keeps the ended jobs read or ended last, so that the nodes of
// a job that just finished, still calling, do not each decode its record
// from the file. Its records are final (an ended job does not change).
type endedJobs struct {
	mu    sync.Mutex
	m     map[string]*nvmegate.Job
	order []string // insertion order, for eviction
}

// maxEndedJobs bounds endedJobs.
const maxEndedJobs = 64

func (e *endedJobs) get(id string) *nvmegate.Job {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m[id]
}

func (e *endedJobs) put(j *nvmegate.Job) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]*nvmegate.Job{}
	}
	if _, ok := e.m[j.ID]; !ok {
		if len(e.order) >= maxEndedJobs {
			delete(e.m, e.order[0])
			e.order = e.order[1:]
		}
		e.order = append(e.order, j.ID)
	}
	e.m[j.ID] = j
}

func (e *endedJobs) drop(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.m[id]; ok {
		delete(e.m, id)
		e.order = slices.DeleteFunc(e.order, func(x string) bool { return x == id })
	}
}

// replace makes r, at rev, the model (a resync from a snapshot). Every
// feed hears of every scope record before and after: anything may have
// changed.
func (m *model) replace(r records, rev uint64) {
	if m.onPolicy != nil && r.policy != nil {
		m.mu.RLock()
		cur := m.records.policy
		m.mu.RUnlock()
		if cur == nil || cur.Digest != r.policy.Digest {
			m.onPolicy(r.policy) // before the revision moves, as apply's
		}
	}
	m.replaceLocked(r, rev)
}

// replaceLocked is replace under the lock.
func (m *model) replaceLocked(r records, rev uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ops []op
	for _, recs := range []*records{&m.records, &r} {
		for _, t := range recs.targets {
			ops = append(ops, op{target: t})
		}
		for _, s := range recs.subsystems {
			ops = append(ops, op{subsystem: s})
		}
		for _, n := range recs.namespaces {
			ops = append(ops, op{namespace: n})
		}
		for _, b := range recs.bindings {
			ops = append(ops, op{binding: b})
		}
		for _, j := range recs.jobs {
			ops = append(ops, op{job: j})
		}
	}
	m.records = r
	m.rev.Store(rev)
	m.scopeRev.Store(rev)
	for _, f := range m.feeds {
		f.add(rev, ops)
	}
}

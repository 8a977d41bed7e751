package audit

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Indexes. The job, tenant and namespace indexes are derived data: they can
// be rebuilt from the entries, so they are not written with every commit
// (that would touch one B-tree leaf per distinct key per commit and cost
// more than the entries). The writer keeps the postings of recent entries
// in memory (memIndex) and writes them in one of its commits every
// indexFlushEntries entries, recording in meta "indexed" the index up to
// which the buckets are complete. Queries read both. After a crash, Open
// re-indexes the entries from "indexed" on (at most one flush interval).
//
// The time index is one record per commit, keyed by the commit's first
// index: the smallest and largest entry time in it. It is written with the
// commit (one put at the right edge of its B-tree: cheap), and a time-range
// query skips the commits that cannot match.

// indexFlushEntries is how many entries the memory index holds before the
// writer flushes it.
const indexFlushEntries = 8192

var metaIndexed = []byte("indexed")

// Namespace index NSIDs with a special meaning.
const (
	// nsidWide marks an entry about a subsystem as a whole (a connect
	// grant lists no namespace): it concerns every namespace in it.
	nsidWide = 0
	// nsidAny collects every entry about the subsystem, for queries by
	// subsystem alone. 0xFFFFFFFF is the NVMe broadcast NSID.
	nsidAny = 0xFFFFFFFF
)

// indexKeys are the index key prefixes of one entry, computed by Append in
// the caller's goroutine.
type indexKeys struct {
	job, tenant []byte
	ns          [][]byte
}

func makeIndexKeys(e *Entry) indexKeys {
	var k indexKeys
	if e.JobID != "" {
		k.job = append([]byte(e.JobID), 0)
	}
	if e.Tenant != "" {
		k.tenant = append([]byte(e.Tenant), 0)
	}
	add := func(sub string, nsid uint32) {
		p := nsPrefix(sub, nsid)
		for _, q := range k.ns {
			if string(q) == string(p) {
				return
			}
		}
		k.ns = append(k.ns, p)
	}
	wide := e.SubsystemNQN != ""
	for _, n := range e.Namespaces {
		if n.SubsystemNQN == "" {
			continue
		}
		add(n.SubsystemNQN, n.NSID)
		add(n.SubsystemNQN, nsidAny)
		if n.SubsystemNQN == e.SubsystemNQN {
			wide = false
		}
	}
	if wide {
		add(e.SubsystemNQN, nsidWide)
		add(e.SubsystemNQN, nsidAny)
	}
	return k
}

// nsPrefix is the idx_namespace key prefix: subsystem NQN, 0x00, NSID.
func nsPrefix(sub string, nsid uint32) []byte {
	k := make([]byte, 0, len(sub)+5)
	k = append(k, sub...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint32(k, nsid)
}

// memIndex holds the postings of the committed entries from `from` on.
type memIndex struct {
	mu   sync.RWMutex
	from uint64
	n    int
	sets [3]map[string][]uint64 // job, tenant, namespace
}

var indexBuckets = [3][]byte{bucketIdxJob, bucketIdxTenant, bucketIdxNS}

func (m *memIndex) reset(from uint64) {
	m.from, m.n = from, 0
	for i := range m.sets {
		m.sets[i] = map[string][]uint64{}
	}
}

func (m *memIndex) add(idx uint64, k *indexKeys) {
	if k.job != nil {
		m.sets[0][string(k.job)] = append(m.sets[0][string(k.job)], idx)
	}
	if k.tenant != nil {
		m.sets[1][string(k.tenant)] = append(m.sets[1][string(k.tenant)], idx)
	}
	for _, p := range k.ns {
		m.sets[2][string(p)] = append(m.sets[2][string(p)], idx)
	}
	m.n++
}

// tail returns a copy of the postings under prefix in set i.
func (m *memIndex) tail(i int, prefix []byte) []uint64 {
	return slices.Clone(m.sets[i][string(prefix)])
}

// flushTo writes the memory postings, plus those of the batch about to be
// committed (extra, starting at index start), into the index buckets and
// records the new high mark end. Called by the writer inside its commit
// transaction; the memory index is reset only after the commit succeeds.
func (m *memIndex) flushTo(tx *bolt.Tx, batch []*appendReq, start, end uint64) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var all [3]map[string][]uint64
	for i := range all {
		all[i] = make(map[string][]uint64, len(m.sets[i]))
		for k, v := range m.sets[i] {
			all[i][k] = slices.Clone(v)
		}
	}
	for j, r := range batch {
		idx := start + uint64(j)
		if r.keys.job != nil {
			all[0][string(r.keys.job)] = append(all[0][string(r.keys.job)], idx)
		}
		if r.keys.tenant != nil {
			all[1][string(r.keys.tenant)] = append(all[1][string(r.keys.tenant)], idx)
		}
		for _, p := range r.keys.ns {
			all[2][string(p)] = append(all[2][string(p)], idx)
		}
	}
	for i, set := range all {
		b := tx.Bucket(indexBuckets[i])
		keys := make([]string, 0, len(set))
		for k := range set {
			keys = append(keys, k)
		}
		slices.Sort(keys) // sorted puts touch each leaf once
		for _, k := range keys {
			idxs := set[k]
			key := binary.BigEndian.AppendUint64([]byte(k), idxs[0])
			if err := b.Put(key, encodePostings(idxs[0], idxs)); err != nil {
				return err
			}
		}
	}
	return tx.Bucket(bucketMeta).Put(metaIndexed, u64(end))
}

// timeRecord is the idx_time value of one commit: the smallest and largest
// entry time (Unix nanoseconds) and the number of entries.
func timeRecord(batch []*appendReq) []byte {
	lo, hi := batch[0].unixNano, batch[0].unixNano
	for _, r := range batch[1:] {
		lo, hi = min(lo, r.unixNano), max(hi, r.unixNano)
	}
	b := binary.BigEndian.AppendUint64(nil, uint64(lo))
	b = binary.BigEndian.AppendUint64(b, uint64(hi))
	return binary.BigEndian.AppendUint32(b, uint32(len(batch)))
}

func decodeTimeRecord(v []byte) (lo, hi time.Time, n uint32, err error) {
	if len(v) != 20 {
		return lo, hi, 0, fmt.Errorf("%w: time index record of %d bytes", ErrCorrupt, len(v))
	}
	lo = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
	hi = time.Unix(0, int64(binary.BigEndian.Uint64(v[8:])))
	return lo, hi, binary.BigEndian.Uint32(v[16:]), nil
}

// rebuildMemIndex re-indexes, into memory, the entries from the "indexed"
// mark to the end of the tree: the postings a crash lost before their
// flush.
func (l *Log) rebuildMemIndex(tx *bolt.Tx) error {
	var from uint64
	if v := tx.Bucket(bucketMeta).Get(metaIndexed); v != nil {
		if len(v) != 8 {
			return fmt.Errorf("%w: indexed mark of %d bytes", ErrCorrupt, len(v))
		}
		from = binary.BigEndian.Uint64(v)
	}
	if from > l.size {
		return fmt.Errorf("%w: indexed mark %d beyond tree size %d", ErrCorrupt, from, l.size)
	}
	l.idx.mu.Lock()
	defer l.idx.mu.Unlock()
	l.idx.reset(from)
	return forEachEntry(tx, from, l.size, func(i uint64, data []byte) error {
		e, err := DecodeEntry(data)
		if err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrCorrupt, i, err)
		}
		k := makeIndexKeys(&e)
		l.idx.add(i, &k)
		return nil
	})
}

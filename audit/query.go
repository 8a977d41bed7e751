package audit

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Page sizes of Query.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Filter selects entries. Zero fields do not filter; all set fields must
// match.
type Filter struct {
	JobID  string
	Tenant string
	// SubsystemNQN with NSID 0 selects every entry about the subsystem or
	// any namespace in it. With NSID > 0 it selects the entries that list
	// that namespace and those about the subsystem as a whole (a connect
	// grant reaches every namespace of its subsystem).
	SubsystemNQN string
	NSID         uint32
	Kinds        []EventKind // any of these kinds; empty means every kind
	Since        time.Time   // entry time ≥ Since
	Until        time.Time   // entry time < Until
}

// Page selects one page of a query.
type Page struct {
	// Size is the most records to return: 0 means DefaultPageSize, more
	// than MaxPageSize means MaxPageSize.
	Size int
	// Token is the previous page's next-page token, "" for the first page.
	Token string
}

// Record is one entry found by Query.
type Record struct {
	Index    uint64
	LeafHash [32]byte
	Entry    Entry
	Raw      []byte // the canonical bytes, as hashed into the tree
}

// A page token is base64url (unpadded) of 'q' followed by the uvarint of
// the next entry index to consider. Results are in index order and the
// log is append-only, so a query resumed with a token never skips or
// repeats an entry. Tokens are not secret and not authenticated.
func encodeQueryToken(next uint64) string {
	return base64.RawURLEncoding.EncodeToString(binary.AppendUvarint([]byte{'q'}, next))
}

func decodeQueryToken(t string) (uint64, error) {
	if t == "" {
		return 0, nil
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(t)
	if err != nil || len(b) < 2 || b[0] != 'q' {
		return 0, fmt.Errorf("%w: bad page token", ErrInvalidQuery)
	}
	v, n := binary.Uvarint(b[1:])
	if n != len(b)-1 {
		return 0, fmt.Errorf("%w: bad page token", ErrInvalidQuery)
	}
	return v, nil
}

// Query returns one page of the entries matching f, in index order, and
// the token of the next page ("" when there is none). It uses the job,
// namespace or tenant index (in that order of preference) if f names one,
// else the time index to skip commits outside [Since, Until), else scans.
func (l *Log) Query(ctx context.Context, f Filter, p Page) ([]Record, string, error) {
	size := p.Size
	switch {
	case size < 0:
		return nil, "", fmt.Errorf("%w: negative page size", ErrInvalidQuery)
	case size == 0:
		size = DefaultPageSize
	case size > MaxPageSize:
		size = MaxPageSize
	}
	from, err := decodeQueryToken(p.Token)
	if err != nil {
		return nil, "", err
	}
	end := l.Size()

	// Snapshot the memory postings and run the read transaction under the
	// same lock, so that a concurrent index flush is seen exactly once
	// (see index.go).
	var lists [][]uint64
	var memFrom uint64
	var bucket []byte
	var prefixes [][]byte
	setIdx := -1
	switch {
	case f.JobID != "":
		setIdx, bucket, prefixes = 0, bucketIdxJob, [][]byte{append([]byte(f.JobID), 0)}
	case f.SubsystemNQN != "" && f.NSID == 0:
		setIdx, bucket, prefixes = 2, bucketIdxNS, [][]byte{nsPrefix(f.SubsystemNQN, nsidAny)}
	case f.SubsystemNQN != "":
		setIdx, bucket, prefixes = 2, bucketIdxNS, [][]byte{nsPrefix(f.SubsystemNQN, f.NSID), nsPrefix(f.SubsystemNQN, nsidWide)}
	case f.Tenant != "":
		setIdx, bucket, prefixes = 1, bucketIdxTenant, [][]byte{append([]byte(f.Tenant), 0)}
	}

	var out []Record
	next := end
	// Lock order: the file (dbmu) before the memory index, as the writer's
	// recovery takes them; the other way round the two deadlock.
	l.dbmu.RLock()
	defer l.dbmu.RUnlock()
	if l.db == nil {
		return nil, "", ErrClosed
	}
	l.idx.mu.RLock()
	memFrom = l.idx.from
	if setIdx >= 0 {
		for _, pre := range prefixes {
			lists = append(lists, l.idx.tail(setIdx, pre))
		}
	}
	var unlock sync.Once
	err = l.db.View(func(tx *bolt.Tx) error {
		unlock.Do(l.idx.mu.RUnlock)
		var cands candidateIter
		switch {
		case setIdx >= 0:
			var its []candidateIter
			for i, pre := range prefixes {
				its = append(its, postingIter(tx.Bucket(bucket), pre, from, memFrom, lists[i]))
			}
			cands = mergeIters(its...)
		case !f.Since.IsZero() || !f.Until.IsZero():
			cands = timeIter(tx.Bucket(bucketIdxTime), from, end, f.Since, f.Until)
		default:
			cands = rangeIter(from, end)
		}
		for len(out) < size {
			if err := ctx.Err(); err != nil {
				return err
			}
			idx, ok, err := cands()
			if err != nil {
				return err
			}
			if !ok || idx >= end {
				next = end
				return nil
			}
			next = idx + 1
			data, err := readEntry(tx, idx)
			if err != nil {
				return err
			}
			e, err := DecodeEntry(data)
			if err != nil {
				return fmt.Errorf("%w: entry %d: %v", ErrCorrupt, idx, err)
			}
			if !f.match(&e) {
				continue
			}
			out = append(out, Record{Index: idx, LeafHash: LeafHash(data), Entry: e, Raw: bytes.Clone(data)})
		}
		return nil
	})
	unlock.Do(l.idx.mu.RUnlock)
	if err != nil {
		return nil, "", err
	}
	tok := ""
	if next < end && len(out) == size {
		tok = encodeQueryToken(next)
	}
	return out, tok, nil
}

func (f *Filter) match(e *Entry) bool {
	if f.JobID != "" && e.JobID != f.JobID ||
		f.Tenant != "" && e.Tenant != f.Tenant ||
		len(f.Kinds) > 0 && !slices.Contains(f.Kinds, e.Kind) ||
		!f.Since.IsZero() && e.Time.Before(f.Since) ||
		!f.Until.IsZero() && !e.Time.Before(f.Until) {
		return false
	}
	if f.SubsystemNQN == "" {
		return true
	}
	if f.NSID == 0 && e.SubsystemNQN == f.SubsystemNQN {
		return true
	}
	wide := e.SubsystemNQN == f.SubsystemNQN
	for _, n := range e.Namespaces {
		if n.SubsystemNQN != f.SubsystemNQN {
			continue
		}
		wide = false
		if f.NSID == 0 || n.NSID == f.NSID {
			return true
		}
	}
	return wide
}

// readEntry returns the entry at index (valid during tx).
func readEntry(tx *bolt.Tx, index uint64) ([]byte, error) {
	var out []byte
	err := forEachEntry(tx, index, index+1, func(_ uint64, d []byte) error {
		out = d
		return nil
	})
	return out, err
}

// candidateIter yields ascending entry indexes; ok is false at the end.
type candidateIter func() (idx uint64, ok bool, err error)

func rangeIter(from, end uint64) candidateIter {
	return func() (uint64, bool, error) {
		if from >= end {
			return 0, false, nil
		}
		from++
		return from - 1, true, nil
	}
}

// postingIter yields the indexes ≥ from under prefix: the flushed postings
// below memFrom from the bucket, then the memory tail.
func postingIter(b *bolt.Bucket, prefix []byte, from, memFrom uint64, tail []uint64) candidateIter {
	c := b.Cursor()
	seek := binary.BigEndian.AppendUint64(bytes.Clone(prefix), from)
	k, v := c.Seek(seek)
	// The list that holds from may start before it.
	if pk, pv := c.Prev(); pk != nil && bytes.HasPrefix(pk, prefix) && len(pk) == len(prefix)+8 {
		k, v = pk, pv
	} else {
		k, v = c.Seek(seek)
	}
	var cur []uint64
	var err error
	inMem := false
	return func() (uint64, bool, error) {
		for {
			if len(cur) > 0 {
				i := cur[0]
				cur = cur[1:]
				if i < from || (!inMem && i >= memFrom) {
					continue
				}
				return i, true, nil
			}
			if inMem {
				return 0, false, nil
			}
			if k == nil || !bytes.HasPrefix(k, prefix) || len(k) != len(prefix)+8 {
				inMem, cur = true, tail
				continue
			}
			if cur, err = decodePostings(k, v); err != nil {
				return 0, false, err
			}
			k, v = c.Next()
		}
	}
}

// mergeIters merges ascending iterators, dropping duplicates.
func mergeIters(its ...candidateIter) candidateIter {
	if len(its) == 1 {
		return its[0]
	}
	type head struct {
		v  uint64
		ok bool
	}
	heads := make([]head, len(its))
	started := false
	var last uint64
	var emitted bool
	return func() (uint64, bool, error) {
		if !started {
			for i, it := range its {
				v, ok, err := it()
				if err != nil {
					return 0, false, err
				}
				heads[i] = head{v, ok}
			}
			started = true
		}
		for {
			best := -1
			for i, h := range heads {
				if h.ok && (best < 0 || h.v < heads[best].v) {
					best = i
				}
			}
			if best < 0 {
				return 0, false, nil
			}
			v := heads[best].v
			nv, ok, err := its[best]()
			if err != nil {
				return 0, false, err
			}
			heads[best] = head{nv, ok}
			if emitted && v == last {
				continue
			}
			last, emitted = v, true
			return v, true, nil
		}
	}
}

// timeIter yields the indexes ≥ from of the commits whose time range meets
// [since, until).
func timeIter(b *bolt.Bucket, from, end uint64, since, until time.Time) candidateIter {
	c := b.Cursor()
	k, v := c.Seek(u64(from))
	if k == nil || binary.BigEndian.Uint64(k) > from {
		if pk, pv := c.Prev(); pk != nil {
			k, v = pk, pv
		} else {
			k, v = c.Seek(u64(from))
		}
	}
	var lo, hi uint64 // current commit's index range
	return func() (uint64, bool, error) {
		for {
			if lo < hi {
				i := lo
				lo++
				if i >= from {
					return i, true, nil
				}
				continue
			}
			if k == nil {
				return 0, false, nil
			}
			first := binary.BigEndian.Uint64(k)
			tlo, thi, n, err := decodeTimeRecord(v)
			if err != nil {
				return 0, false, err
			}
			k, v = c.Next()
			if !since.IsZero() && thi.Before(since) || !until.IsZero() && !tlo.Before(until) {
				continue
			}
			lo, hi = first, min(first+uint64(n), end)
		}
	}
}

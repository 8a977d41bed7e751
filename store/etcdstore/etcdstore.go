package etcdstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/store"
)

const (
	pageSize  = 64      // changes read per request while catching up
	chunkSize = 1 << 20 // bytes of a snapshot chunk
)

// Store is the store.Replica on etcd.
type Store struct {
	kv     clientv3.KV
	prefix string
}

var _ store.Replica = (*Store)(nil)

// New is the replicated store under prefix in etcd.
func New(kv clientv3.KV, prefix string) *Store { return &Store{kv: kv, prefix: prefix} }

func (s *Store) revKey() string              { return s.prefix + "rev" }
func (s *Store) changeKey(rev uint64) string { return fmt.Sprintf("%sch/%016x", s.prefix, rev) }
func (s *Store) snapKey() string             { return s.prefix + "snap" }
func (s *Store) chunkKey(rev uint64, i int) string {
	return fmt.Sprintf("%ssnap/%016x/%08x", s.prefix, rev, i)
}

func u64(v uint64) string { return string(binary.BigEndian.AppendUint64(nil, v)) }

// ErrFenced is returned by a write whose fence failed: the caller is no
// longer the leader it was when it began.
var ErrFenced = errors.New("etcdstore: not the leader any more; nothing written")

type fenceKey struct{}

// Fence makes the writes under ctx conditional on cmp (a leader's
// election key still being its own, leader.Fence): a write whose fence
// fails stores nothing and returns ErrFenced.
func Fence(ctx context.Context, cmp clientv3.Cmp) context.Context {
	return context.WithValue(ctx, fenceKey{}, cmp)
}

func fenceOf(ctx context.Context) (clientv3.Cmp, bool) {
	c, ok := ctx.Value(fenceKey{}).(clientv3.Cmp)
	return c, ok
}

// Commit stores ch iff rev is ch.Revision-1 (and the fence in ctx holds).
func (s *Store) Commit(ctx context.Context, ch store.Change) error {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Value(s.revKey()), "=", u64(ch.Revision-1))}
	if ch.Revision == 1 {
		cmps[0] = clientv3.Compare(clientv3.CreateRevision(s.revKey()), "=", 0)
	}
	fence, fenced := fenceOf(ctx)
	if fenced {
		cmps = append(cmps, fence)
	}
	resp, err := s.kv.Txn(ctx).If(cmps...).Then(
		clientv3.OpPut(s.revKey(), u64(ch.Revision)),
		clientv3.OpPut(s.changeKey(ch.Revision), string(store.EncodeWrites(nil, ch.Writes))),
	).Else(
		clientv3.OpGet(s.revKey()),
		// The changes this replica missed, to catch up in this round trip.
		clientv3.OpGet(s.changeKey(ch.Revision), clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.prefix+"ch/")), clientv3.WithLimit(pageSize)),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: commit revision %d: %w", ch.Revision, err)
	}
	if resp.Succeeded {
		return nil
	}
	if fenced {
		// Which compare failed: a revision still ch.Revision-1 means the
		// fence did.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		at := ch.Revision == 1 && len(kvs) == 0 || len(kvs) == 1 && string(kvs[0].Value) == u64(ch.Revision-1)
		if at {
			return ErrFenced
		}
	}
	missed := resp.Responses[1].GetResponseRange().Kvs
	c := &store.Conflict{}
	for i, kv := range missed {
		if string(kv.Key) != s.changeKey(ch.Revision+uint64(i)) {
			break // trimmed, or a gap: the store reads them itself
		}
		ws, err := store.DecodeWrites(kv.Value)
		if err != nil {
			return fmt.Errorf("etcdstore: %s: %w", kv.Key, err)
		}
		c.Changes = append(c.Changes, store.Change{Revision: ch.Revision + uint64(i), Writes: ws})
	}
	return fmt.Errorf("etcdstore: commit revision %d: %w", ch.Revision, c)
}

// Revision is the store's latest revision (0 before the first commit).
func (s *Store) Revision(ctx context.Context) (uint64, error) {
	r, err := s.kv.Get(ctx, s.revKey())
	if err != nil {
		return 0, fmt.Errorf("etcdstore: read the revision: %w", err)
	}
	if len(r.Kvs) == 0 {
		return 0, nil
	}
	if len(r.Kvs[0].Value) != 8 {
		return 0, fmt.Errorf("etcdstore: revision of %d bytes", len(r.Kvs[0].Value))
	}
	return binary.BigEndian.Uint64(r.Kvs[0].Value), nil
}

// Changes calls fn with the changes after from, all read at one etcd
// revision; ErrResync if the first of them was trimmed by a snapshot.
func (s *Store) Changes(ctx context.Context, from uint64, fn func(store.Change) error) error {
	r, err := s.kv.Get(ctx, s.revKey())
	if err != nil {
		return fmt.Errorf("etcdstore: read the revision: %w", err)
	}
	var head uint64
	if len(r.Kvs) == 1 {
		if len(r.Kvs[0].Value) != 8 {
			return fmt.Errorf("etcdstore: revision of %d bytes", len(r.Kvs[0].Value))
		}
		head = binary.BigEndian.Uint64(r.Kvs[0].Value)
	}
	switch {
	case head < from:
		return fmt.Errorf("etcdstore: the replicated store is at revision %d, before this copy (%d): it lost changes, or this copy is another store's", head, from)
	case head == from:
		return nil
	}
	at := r.Header.Revision
	end := clientv3.GetPrefixRangeEnd(s.prefix + "ch/")
	for next := from + 1; next <= head; {
		resp, err := s.kv.Get(ctx, s.changeKey(next), clientv3.WithRange(end), clientv3.WithRev(at), clientv3.WithLimit(pageSize))
		if err != nil {
			return fmt.Errorf("etcdstore: read changes from %d: %w", next, err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) != s.changeKey(next) {
				if next == from+1 {
					return store.ErrResync // trimmed by a snapshot
				}
				return fmt.Errorf("etcdstore: change %s where %s was due: a gap", kv.Key, s.changeKey(next))
			}
			ws, err := store.DecodeWrites(kv.Value)
			if err != nil {
				return fmt.Errorf("etcdstore: %s: %w", kv.Key, err)
			}
			if err := fn(store.Change{Revision: next, Writes: ws}); err != nil {
				return err
			}
			next++
		}
		if len(resp.Kvs) == 0 {
			if next == from+1 {
				return store.ErrResync
			}
			return fmt.Errorf("etcdstore: changes from %d missing (revision %d)", next, head)
		}
	}
	return nil
}

// Snapshot calls fn with the writes of the latest snapshot.
func (s *Store) Snapshot(ctx context.Context, fn func(store.Write) error) (uint64, error) {
	r, err := s.kv.Get(ctx, s.snapKey())
	if err != nil {
		return 0, fmt.Errorf("etcdstore: read the snapshot: %w", err)
	}
	if len(r.Kvs) == 0 {
		return 0, nil // none yet: every change since the first is kept
	}
	v := r.Kvs[0].Value
	if len(v) != 12 {
		return 0, fmt.Errorf("etcdstore: snapshot record of %d bytes", len(v))
	}
	rev, n := binary.BigEndian.Uint64(v), int(binary.BigEndian.Uint32(v[8:]))
	for i := range n {
		c, err := s.kv.Get(ctx, s.chunkKey(rev, i), clientv3.WithRev(r.Header.Revision))
		if err != nil {
			return 0, fmt.Errorf("etcdstore: read snapshot chunk %d: %w", i, err)
		}
		if len(c.Kvs) != 1 {
			return 0, fmt.Errorf("etcdstore: snapshot %d: chunk %d missing", rev, i)
		}
		ws, err := store.DecodeWrites(c.Kvs[0].Value)
		if err != nil {
			return 0, fmt.Errorf("etcdstore: snapshot %d chunk %d: %w", rev, i, err)
		}
		for _, w := range ws {
			if err := fn(w); err != nil {
				return 0, err
			}
		}
	}
	return rev, nil
}

// Compact writes a snapshot of db (a copy up to date with the replicated
// store) and deletes the changes it covers and the snapshot before it.
// The leader runs it; under a Fence, a former leader's compaction
// publishes nothing.
func (s *Store) Compact(ctx context.Context, db interface {
	Dump(context.Context, func(store.Write) error) (uint64, error)
}) (uint64, error) {
	var (
		chunks [][]byte
		cur    []byte
	)
	rev, err := db.Dump(ctx, func(w store.Write) error {
		cur = store.EncodeWrites(cur, []store.Write{w})
		if len(cur) >= chunkSize {
			chunks, cur = append(chunks, cur), nil
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	prev, err := s.kv.Get(ctx, s.snapKey())
	if err != nil {
		return 0, fmt.Errorf("etcdstore: compact: %w", err)
	}
	var old uint64
	if len(prev.Kvs) == 1 && len(prev.Kvs[0].Value) == 12 {
		old = binary.BigEndian.Uint64(prev.Kvs[0].Value)
		if old >= rev {
			return old, nil // a snapshot as recent is there
		}
	}
	for i, c := range chunks {
		if _, err := s.kv.Put(ctx, s.chunkKey(rev, i), string(c)); err != nil {
			return 0, fmt.Errorf("etcdstore: compact: chunk %d: %w", i, err)
		}
	}
	rec := binary.BigEndian.AppendUint32([]byte(u64(rev)), uint32(len(chunks)))
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.snapKey()), "=", modRev(prev))}
	if fence, ok := fenceOf(ctx); ok {
		cmps = append(cmps, fence)
	}
	// Publish the snapshot and trim what it covers, at once.
	resp, err := s.kv.Txn(ctx).If(cmps...).Then(
		clientv3.OpPut(s.snapKey(), string(rec)),
		clientv3.OpDelete(s.changeKey(0), clientv3.WithRange(s.changeKey(rev+1))),
		clientv3.OpDelete(s.chunkKey(old, 0), clientv3.WithRange(s.chunkKey(rev, 0))),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("etcdstore: compact: %w", err)
	}
	if !resp.Succeeded {
		_, _ = s.kv.Delete(ctx, s.chunkKey(rev, 0), clientv3.WithRange(s.chunkKey(rev+1, 0)))
		return 0, fmt.Errorf("etcdstore: compact: %w", ErrFenced)
	}
	return rev, nil
}

func modRev(r *clientv3.GetResponse) int64 {
	if len(r.Kvs) == 0 {
		return 0
	}
	return r.Kvs[0].ModRevision
}

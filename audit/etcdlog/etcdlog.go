package etcdlog

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/audit"
)

// pageSize is the commits read per request while catching up (each up to
// about 1 MiB).
const pageSize = 16

// Log is the audit.Replica on etcd.
type Log struct {
	kv     clientv3.KV
	prefix string
}

var _ audit.Replica = (*Log)(nil)

// New is the replicated log stored under prefix in etcd.
func New(kv clientv3.KV, prefix string) *Log { return &Log{kv: kv, prefix: prefix} }

func (l *Log) treeKey() string               { return l.prefix + "tree" }
func (l *Log) commitKey(start uint64) string { return fmt.Sprintf("%sc/%016x", l.prefix, start) }
func (l *Log) cpLatestKey() string           { return l.prefix + "cp" }
func (l *Log) cpKey(size uint64) string      { return fmt.Sprintf("%scp/%016x", l.prefix, size) }

func head(size uint64, root [32]byte) string {
	return string(append(binary.BigEndian.AppendUint64(nil, size), root[:]...))
}

// Append stores c iff the tree's head is (c.Start, c.PrevRoot), or, with
// c.Pending, the head the first pending commit extends; then it stores
// the pending commits with c. It is one transaction of nested
// alternatives, c alone first, and last, if none applies, a read of the
// head and of the commit stored at c.Start: c may be there already.
func (l *Log) Append(ctx context.Context, c audit.Commit) error {
	chain := append(append(make([]audit.Commit, 0, len(c.Pending)+1), c.Pending...), c)
	for i := 1; i < len(chain); i++ {
		if chain[i].Start != chain[i-1].End || chain[i].PrevRoot != chain[i-1].Root {
			return fmt.Errorf("etcdlog: append at %d: pending commit at %d does not lead to it", c.Start, chain[i-1].Start)
		}
	}
	// Innermost first: the longest chain, whose failure reads the head,
	// the commit at c's place, and the commits this writer missed.
	otherwise := []clientv3.Op{clientv3.OpGet(l.treeKey()), clientv3.OpGet(l.commitKey(c.Start)),
		clientv3.OpGet(l.commitKey(chain[0].Start), clientv3.WithRange(clientv3.GetPrefixRangeEnd(l.prefix+"c/")), clientv3.WithLimit(pageSize))}
	var cmps []clientv3.Cmp
	var puts []clientv3.Op
	for i := 0; i < len(chain); i++ {
		var err error
		if cmps, puts, err = l.store(chain[i:]); err != nil {
			return fmt.Errorf("etcdlog: append at %d: %w", c.Start, err)
		}
		if i < len(chain)-1 {
			otherwise = []clientv3.Op{clientv3.OpTxn(cmps, puts, otherwise)}
		}
	}
	resp, err := l.kv.Txn(ctx).If(cmps...).Then(puts...).Else(otherwise...).Commit()
	if err != nil {
		return fmt.Errorf("etcdlog: append at %d: %w", c.Start, err)
	}
	r := (*etcdserverpb.TxnResponse)(resp)
	for !r.Succeeded {
		nested := r.Responses[0].GetResponseTxn()
		if nested == nil {
			break
		}
		r = nested
	}
	if r.Succeeded {
		return nil
	}
	if stored := r.Responses[1].GetResponseRange().Kvs; len(stored) == 1 {
		if s, err := decodeCommit(stored[0].Value); err == nil && s.End == c.End && s.Root == c.Root {
			return nil // stored before: by a later commit carrying it, or an answer lost
		}
	}
	conditional := false
	for _, x := range chain {
		conditional = conditional || len(x.Conditions) > 0
	}
	if conditional {
		// The head one of the alternatives expects: a condition
		// failed, not the race.
		kvs := r.Responses[0].GetResponseRange().Kvs
		for _, x := range chain {
			if x.Start == 0 && len(kvs) == 0 || len(kvs) == 1 && string(kvs[0].Value) == head(x.Start, x.PrevRoot) {
				return fmt.Errorf("etcdlog: append at %d: %w", c.Start, audit.ErrFenced)
			}
		}
	}
	return fmt.Errorf("etcdlog: append at %d: %w", c.Start, l.missed(chain[0].Start, r.Responses[2].GetResponseRange().Kvs))
}

// missed is the conflict with the commits from start on that kvs hold, up
// to the first gap (a page ends, or a key is not where the last one ended).
func (l *Log) missed(start uint64, kvs []*mvccpb.KeyValue) *audit.Conflict {
	c := &audit.Conflict{}
	next := start
	for _, kv := range kvs {
		if string(kv.Key) != l.commitKey(next) {
			break
		}
		cm, err := decodeCommit(kv.Value)
		if err != nil || cm.End <= next {
			break // the catch-up reads it again, and says what is wrong
		}
		cm.Start = next
		c.Commits = append(c.Commits, cm)
		next = cm.End
	}
	return c
}

// store is the compares and puts that store chain, commits each ending
// where the next starts, on the tree the first extends, under the
// conditions of all.
func (l *Log) store(chain []audit.Commit) ([]clientv3.Cmp, []clientv3.Op, error) {
	first, last := chain[0], chain[len(chain)-1]
	cmp := clientv3.Compare(clientv3.Value(l.treeKey()), "=", head(first.Start, first.PrevRoot))
	if first.Start == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(l.treeKey()), "=", 0)
	}
	cmps := []clientv3.Cmp{cmp}
	puts := []clientv3.Op{clientv3.OpPut(l.treeKey(), head(last.End, last.Root))}
	for _, x := range chain {
		for _, cond := range x.Conditions {
			f, err := condition(cond)
			if err != nil {
				return nil, nil, err
			}
			cmps = append(cmps, f)
		}
		puts = append(puts, clientv3.OpPut(l.commitKey(x.Start), string(encodeCommit(x))))
	}
	return cmps, puts, nil
}

// Head is the tree's size, read linearizably.
func (l *Log) Head(ctx context.Context) (uint64, error) {
	t, err := l.kv.Get(ctx, l.treeKey())
	if err != nil {
		return 0, fmt.Errorf("etcdlog: read the tree head: %w", err)
	}
	if len(t.Kvs) == 0 {
		return 0, nil
	}
	size, _, err := decodeHead(t.Kvs[0].Value)
	return size, err
}

// Commits calls fn with the commits from index from on, all read at one
// etcd revision.
func (l *Log) Commits(ctx context.Context, from uint64, fn func(audit.Commit) error) error {
	// The head and where the tail starts, at one revision.
	t, err := l.kv.Txn(ctx).Then(clientv3.OpGet(l.treeKey()), clientv3.OpGet(l.startKey())).Commit()
	if err != nil {
		return fmt.Errorf("etcdlog: read the tree head: %w", err)
	}
	var size uint64
	if kvs := t.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if size, _, err = decodeHead(kvs[0].Value); err != nil {
			return err
		}
	}
	switch {
	case size < from:
		return fmt.Errorf("etcdlog: the replicated log ends at %d, before this copy (%d): it lost commits, or this copy is another log's", size, from)
	case size == from:
		return nil
	}
	if kvs := t.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
		start, root, err := decodeHead(kvs[0].Value)
		if err != nil {
			return err
		}
		if from < start {
			return fmt.Errorf("etcdlog: commits from %d: %w", from, &audit.TrimmedError{Start: start, Root: root})
		}
	}
	rev := t.Header.Revision
	key, end := l.commitKey(from), clientv3.GetPrefixRangeEnd(l.prefix+"c/")
	next := from
	for next < size {
		resp, err := l.kv.Get(ctx, key, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(pageSize))
		if err != nil {
			return fmt.Errorf("etcdlog: read commits from %d: %w", next, err)
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("etcdlog: commits from %d missing (tree size %d)", next, size)
		}
		for _, kv := range resp.Kvs {
			c, err := decodeCommit(kv.Value)
			if err != nil {
				return fmt.Errorf("etcdlog: %s: %w", kv.Key, err)
			}
			c.Start = next
			if string(kv.Key) != l.commitKey(next) {
				return fmt.Errorf("etcdlog: commit %s where %s was due: a gap", kv.Key, l.commitKey(next))
			}
			if err := fn(c); err != nil {
				return err
			}
			next = c.End
			key = l.commitKey(next)
			if next >= size {
				break
			}
		}
	}
	return nil
}

// A commit's value is its end, the roots before and after it and its
// records; one that carries changes (a leader's proposals) is marked by
// a first byte no end can have (2^56 entries), and its records are
// followed by the changes: revision, entry index, snapshot flag, and the
// payload with its length.
const changesMark = 0xff

func encodeCommit(x audit.Commit) []byte {
	n := 72 + len(x.Records)
	for _, c := range x.Changes {
		n += 8 + 8 + 1 + 4 + len(c.Payload)
	}
	v := make([]byte, 0, n+5)
	if len(x.Changes) > 0 {
		v = append(v, changesMark)
		v = binary.BigEndian.AppendUint32(v, uint32(len(x.Records)))
	}
	v = binary.BigEndian.AppendUint64(v, x.End)
	v = append(append(append(v, x.PrevRoot[:]...), x.Root[:]...), x.Records...)
	for _, c := range x.Changes {
		v = binary.BigEndian.AppendUint64(v, c.Revision)
		v = binary.BigEndian.AppendUint64(v, c.Index)
		flag := byte(0)
		if c.Snapshot {
			flag = 1
		}
		v = append(v, flag)
		v = binary.BigEndian.AppendUint32(v, uint32(len(c.Payload)))
		v = append(v, c.Payload...)
	}
	return v
}

// watched are the commits of put events, in order, each with its Start
// from its key; one that does not decode ends the list there (the
// catch-up reads it again and says what is wrong).
func (l *Log) watched(evs []*clientv3.Event) []audit.Commit {
	var out []audit.Commit
	for _, ev := range evs {
		var start uint64
		if _, err := fmt.Sscanf(strings.TrimPrefix(string(ev.Kv.Key), l.prefix+"c/"), "%016x", &start); err != nil {
			break
		}
		c, err := decodeCommit(ev.Kv.Value)
		if err != nil {
			break
		}
		c.Start = start
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil // Offer's nil: catch up
	}
	return out
}

func decodeCommit(v []byte) (audit.Commit, error) {
	var recs = -1
	if len(v) > 0 && v[0] == changesMark {
		if len(v) < 5 {
			return audit.Commit{}, fmt.Errorf("commit record of %d bytes", len(v))
		}
		recs, v = int(binary.BigEndian.Uint32(v[1:])), v[5:]
	}
	if len(v) < 72 {
		return audit.Commit{}, fmt.Errorf("commit record of %d bytes", len(v))
	}
	c := audit.Commit{End: binary.BigEndian.Uint64(v)}
	if v[0] == changesMark {
		return audit.Commit{}, fmt.Errorf("commit record: an end of %d", c.End)
	}
	copy(c.PrevRoot[:], v[8:40])
	copy(c.Root[:], v[40:72])
	v = v[72:]
	if recs < 0 {
		c.Records = v
		return c, nil
	}
	if recs > len(v) {
		return audit.Commit{}, fmt.Errorf("commit record: %d bytes of entries, %d left", recs, len(v))
	}
	c.Records, v = v[:recs], v[recs:]
	for len(v) > 0 {
		if len(v) < 21 {
			return audit.Commit{}, fmt.Errorf("commit record: a change of %d bytes", len(v))
		}
		ch := audit.ChangeRecord{Revision: binary.BigEndian.Uint64(v), Index: binary.BigEndian.Uint64(v[8:])}
		switch v[16] {
		case 0:
		case 1:
			ch.Snapshot = true
		default:
			return audit.Commit{}, fmt.Errorf("commit record: change flag %d", v[16])
		}
		n := int(binary.BigEndian.Uint32(v[17:]))
		if n > len(v)-21 {
			return audit.Commit{}, fmt.Errorf("commit record: a payload of %d bytes, %d left", n, len(v)-21)
		}
		ch.Payload, v = v[21:21+n], v[21+n:]
		c.Changes = append(c.Changes, ch)
	}
	return c, nil
}

// PutCheckpoint stores cp unless a checkpoint of its size or larger is
// stored.
func (l *Log) PutCheckpoint(ctx context.Context, rc audit.ReplicatedCheckpoint) error {
	cp, err := audit.ParseCheckpoint(rc.Note)
	if err != nil {
		return fmt.Errorf("etcdlog: %w", err)
	}
	v := binary.BigEndian.AppendUint64(nil, rc.KeyVersion)
	v = binary.BigEndian.AppendUint32(v, uint32(len(rc.KeyPEM)))
	v = append(append(v, rc.KeyPEM...), rc.Note...)
	size := string(binary.BigEndian.AppendUint64(nil, cp.Size))
	puts := []clientv3.Op{clientv3.OpPut(l.cpLatestKey(), size), clientv3.OpPut(l.cpKey(cp.Size), string(v))}
	var fence []clientv3.Cmp
	if c := audit.ConditionOf(ctx); c != nil {
		f, err := condition(c)
		if err != nil {
			return err
		}
		fence = append(fence, f)
	}
	// Big-endian sizes compare as bytes compare; a missing key is the
	// first checkpoint.
	for _, cmp := range []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(l.cpLatestKey()), "<", size),
		clientv3.Compare(clientv3.CreateRevision(l.cpLatestKey()), "=", 0),
	} {
		resp, err := l.kv.Txn(ctx).If(append([]clientv3.Cmp{cmp}, fence...)...).Then(puts...).Commit()
		if err != nil {
			return fmt.Errorf("etcdlog: store the checkpoint of size %d: %w", cp.Size, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	if len(fence) > 0 {
		// Refused by the size, or by the fence: the fence alone says.
		resp, err := l.kv.Txn(ctx).If(fence...).Commit()
		if err != nil {
			return fmt.Errorf("etcdlog: store the checkpoint of size %d: %w", cp.Size, err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("etcdlog: store the checkpoint of size %d: %w", cp.Size, audit.ErrFenced)
		}
	}
	return nil // one of this size or larger is there
}

// Checkpoints returns the checkpoints of sizes above after, by size.
func (l *Log) Checkpoints(ctx context.Context, after uint64) ([]audit.ReplicatedCheckpoint, error) {
	resp, err := l.kv.Get(ctx, l.cpKey(after+1), clientv3.WithRange(clientv3.GetPrefixRangeEnd(l.prefix+"cp/")))
	if err != nil {
		return nil, fmt.Errorf("etcdlog: read checkpoints: %w", err)
	}
	out := make([]audit.ReplicatedCheckpoint, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		v := kv.Value
		if len(v) < 12 || uint64(len(v)-12) < uint64(binary.BigEndian.Uint32(v[8:])) {
			return nil, fmt.Errorf("etcdlog: %s: checkpoint record of %d bytes", kv.Key, len(v))
		}
		n := int(binary.BigEndian.Uint32(v[8:]))
		out = append(out, audit.ReplicatedCheckpoint{KeyVersion: binary.BigEndian.Uint64(v),
			KeyPEM: bytes.Clone(v[12 : 12+n]), Note: bytes.Clone(v[12+n:])})
	}
	return out, nil
}

// Follow keeps a copy current until ctx ends: it calls sync at once with
// size 0, after every change of the tree's head with the head's size, and
// after every new checkpoint with size 0 (coalesced: a sync covers every
// change before it). sync may skip a size its copy holds already (its own
// commits, or those a lost race brought); size 0 asks for a full catch-up,
// checkpoints too. A broken watch (a compacted revision, a lost member) is
// started again.
func (l *Log) Follow(ctx context.Context, w clientv3.Watcher, sync func(ctx context.Context, size uint64) error) error {
	return l.follow(ctx, w, nil, sync)
}

// FollowCommits is Follow handing each batch of commits the watch
// delivers to offer, decoded from the watch's payload (audit.Log.Offer),
// instead of making the copy read them again; sync runs when the watch
// (re)starts and for each new checkpoint.
func (l *Log) FollowCommits(ctx context.Context, w clientv3.Watcher, offer func([]audit.Commit), sync func(ctx context.Context, size uint64) error) error {
	return l.follow(ctx, w, offer, sync)
}

func (l *Log) follow(ctx context.Context, w clientv3.Watcher, offer func([]audit.Commit), sync func(ctx context.Context, size uint64) error) error {
	for ctx.Err() == nil {
		_ = sync(ctx, 0) // an error is retried at the next change
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		heads, cps := w.Watch(wctx, l.treeKey()), w.Watch(wctx, l.cpLatestKey())
		if offer != nil {
			heads = w.Watch(wctx, l.prefix+"c/", clientv3.WithPrefix(), clientv3.WithFilterDelete())
		}
	watch:
		for {
			select {
			case resp, ok := <-heads:
				if !ok || resp.Err() != nil {
					break watch
				}
				if offer != nil {
					offer(l.watched(resp.Events))
					continue
				}
				var size uint64
				for _, ev := range resp.Events {
					if v := ev.Kv.Value; len(v) == 40 {
						size = max(size, binary.BigEndian.Uint64(v))
					}
				}
				_ = sync(ctx, size)
			case resp, ok := <-cps:
				if !ok || resp.Err() != nil {
					break watch
				}
				_ = sync(ctx, 0)
			}
		}
		cancel()
		select { // a watch that keeps breaking is not a busy loop
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return ctx.Err()
}

// condition is an appender's condition as an etcd compare.
func condition(c any) (clientv3.Cmp, error) {
	switch f := c.(type) {
	case clientv3.Cmp:
		return f, nil
	case *clientv3.Cmp:
		return *f, nil
	}
	return clientv3.Cmp{}, fmt.Errorf("etcdlog: a condition of type %T is not an etcd compare", c)
}

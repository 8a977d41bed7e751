package audit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/transparency-dev/merkle/proof"
	bolt "go.etcd.io/bbolt"
)

// A replicated log keeps only its tail: the leader trims the commits every
// replica's copy holds durably (etcdlog.Log.Trim). The history before the
// tail lives in the copies, and a copy that lacks some of it (a new
// replica, a copy set aside after a crash) fetches it from another copy.
// Another copy is not trusted: each page it serves is checked to lead to
// the tree the Replica names where its tail starts (a consistency proof
// to that root), inside the transaction that would store it.

// ErrTrimmed is what a Replica's Commits wraps (TrimmedError) when it no
// longer holds the commits asked for.
var ErrTrimmed = errors.New("audit: the replicated log no longer holds these commits")

// TrimmedError says where the replicated log's tail starts: its first
// commit extends the tree of Start entries, whose root is Root.
type TrimmedError struct {
	Start uint64
	Root  [32]byte
}

func (e *TrimmedError) Error() string {
	return fmt.Sprintf("audit: the replicated log starts at entry %d: the history before it is in the replicas' copies", e.Start)
}

func (e *TrimmedError) Unwrap() error { return ErrTrimmed }

// HistorySource serves a copy's history to a copy that lacks it: another
// replica's (forward.Client), or a Log itself.
type HistorySource interface {
	// History is the commit of the entries from index from on (at least
	// one, up to a page), with the proof that the tree it ends is a prefix
	// of the tree of to entries.
	History(ctx context.Context, from, to uint64) (HistoryPage, error)
}

// HistoryPage is one page of history: a commit (its entries, their
// changes and the roots around it) and the consistency proof from the tree
// it ends to the tree of the size asked for.
type HistoryPage struct {
	Commit Commit   `json:"commit"`
	Proof  [][]byte `json:"proof,omitempty"`
}

// Bounds of a history page: it is one message of the peer service.
const (
	historyPageEntries = 4096
	historyPageBytes   = 2 << 20
)

var _ HistorySource = (*Log)(nil)

// History serves this copy's entries from index from on, up to a page and
// before to (≤ Size()), with their changes' payloads and the consistency
// proof of the page's tree to the tree of to entries.
func (l *Log) History(ctx context.Context, from, to uint64) (HistoryPage, error) {
	if err := l.checkSize(to); err != nil {
		return HistoryPage{}, err
	}
	if from >= to {
		return HistoryPage{}, fmt.Errorf("%w: history from %d to %d", ErrTreeSize, from, to)
	}
	end := min(to, from+historyPageEntries)
	c := Commit{Start: from}
	err := l.view(func(tx *bolt.Tx) error {
		n := 0
		return forEachEntry(tx, from, end, func(index uint64, data []byte) error {
			if n > 0 && n+len(data) > historyPageBytes {
				return errPageFull
			}
			e, err := DecodeEntry(data)
			if err != nil {
				return fmt.Errorf("%w: entry %d: %v", ErrCorrupt, index, err)
			}
			if e.Change != nil {
				ch, err := storedChange(tx, &e, index)
				if err != nil {
					return err
				}
				n += len(ch.Payload)
				c.Changes = append(c.Changes, ch)
			}
			c.Records = appendRecord(c.Records, data)
			c.End = index + 1
			n += len(data)
			return nil
		})
	})
	if err != nil && !errors.Is(err, errPageFull) {
		return HistoryPage{}, err
	}
	if c.PrevRoot, err = l.RootAt(ctx, c.Start); err != nil {
		return HistoryPage{}, err
	}
	if c.Root, err = l.RootAt(ctx, c.End); err != nil {
		return HistoryPage{}, err
	}
	p := HistoryPage{Commit: c}
	if c.End < to {
		if p.Proof, err = l.ConsistencyProof(ctx, c.End, to); err != nil {
			return HistoryPage{}, err
		}
	}
	return p, nil
}

var errPageFull = errors.New("page full")

// storedChange is the payload of the change entry e (at index) records,
// as a commit carries it.
func storedChange(tx *bolt.Tx, e *Entry, index uint64) (ChangeRecord, error) {
	snapshot := e.Kind == EventStateSnapshot
	b := tx.Bucket(bucketChanges)
	if snapshot {
		b = tx.Bucket(bucketSnapshots)
	}
	var v []byte
	if b != nil {
		v = b.Get(u64(e.Change.Revision))
	}
	if len(v) < 8 || binary.BigEndian.Uint64(v) != index {
		return ChangeRecord{}, fmt.Errorf("%w: entry %d records change %d, which this copy lacks", ErrCorrupt, index, e.Change.Revision)
	}
	return ChangeRecord{Revision: e.Change.Revision, Index: index, Snapshot: snapshot, Payload: append([]byte(nil), v[8:]...)}, nil
}

// replicaCommits is Replica.Commits from index from, filling first from
// Options.History the history the Replica trimmed.
func (l *Log) replicaCommits(ctx context.Context, from uint64, fn func(Commit) error) error {
	err := l.opts.Replica.Commits(ctx, from, fn)
	var t *TrimmedError
	if !errors.As(err, &t) || l.Size() >= t.Start {
		return err
	}
	if err := l.fillHistory(t); err != nil {
		return err
	}
	return l.opts.Replica.Commits(ctx, l.Size(), fn)
}

// fillHistory brings this copy up to the start of the replicated log's
// tail from another copy, page by page, each page checked to lead to the
// tail's root before it is stored.
func (l *Log) fillHistory(t *TrimmedError) error {
	src := l.opts.History
	if src == nil {
		return fmt.Errorf("%w (this copy ends at %d, and has no other copy to fetch the history from)", t, l.Size())
	}
	for size := l.Size(); size < t.Start; size = l.Size() {
		ctx, cancel := l.replicaCtx()
		page, err := src.History(ctx, size, t.Start)
		cancel()
		if err != nil {
			return fmt.Errorf("fetch the history from %d: %w", size, err)
		}
		c := page.Commit
		if c.Start != size || c.End <= size || c.End > t.Start {
			return fmt.Errorf("%w: a history page of [%d, %d) where [%d, …≤%d) was asked for", ErrCorrupt, c.Start, c.End, size, t.Start)
		}
		err = l.applyCommitChecked(c, func(root [32]byte) error {
			if c.End == t.Start {
				if root != t.Root {
					return fmt.Errorf("%w: the history up to %d hashes to %x, the replicated log's tail starts from %x", ErrCorrupt, t.Start, root[:8], t.Root[:8])
				}
				return nil
			}
			if err := proof.VerifyConsistency(hasher, c.End, t.Start, page.Proof, root[:], t.Root[:]); err != nil {
				return fmt.Errorf("%w: the history page [%d, %d) is not a prefix of the replicated log: %v", ErrCorrupt, c.Start, c.End, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

package audit

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/transparency-dev/merkle/compact"
	bolt "go.etcd.io/bbolt"
)

// A Proposal is a state change the log sequences: the writer prepares it
// in log order, when the index of its first entry is known, and appends
// its entries and its payload in one commit with the batch it is in. That
// commit is the change's only durable round: the state it changes (the
// store) is a projection of the log, replayed from the payloads after a
// crash (Changes).
type Proposal interface {
	// Prepare is called by the writer, in log order, with the index the
	// proposal's first entry will have. It validates the change against
	// the state every earlier proposal left and returns what to append,
	// or an error, which is Propose's answer: nothing of the proposal is
	// appended and Done is not called.
	Prepare(first uint64) (Prepared, error)
	// Done is called, after a successful Prepare, once the commit is
	// durable (nil) or has failed (why). Those of one commit are called
	// in log order on success and in reverse order on failure, so that
	// each proposal can undo what it prepared.
	Done(err error)
}

// Prepared is what a prepared proposal appends: its entries, and the
// change's payload with the revision it makes. Entries[0] records the
// change (its ChangeRef is set by the log).
type Prepared struct {
	Entries  []Entry
	Revision uint64
	Payload  []byte
	// Snapshot: the payload is the whole state at Revision, not a change
	// (a genesis: the state a log that begins recording changes starts
	// from); kept apart from the changes (Snapshot).
	Snapshot bool
}

// ErrNoProposals is Propose's answer on a replicated log to a proposal
// without its term's fence (WithCondition): only the term's leader
// sequences, and a former leader's proposal must be refused by the
// replica, not raced against the new one's.
var ErrNoProposals = errors.New("audit: a proposal on a replicated log needs its term's fence (only the leader sequences)")

// Propose sequences p and returns the index of its first entry once its
// entries and payload are durable (on a replicated log: in the Replica,
// under ctx's condition). An error from p's Prepare is returned
// unchanged; any other error means the change is not known to be durable.
// A replicated proposal the Replica refuses (the tree moved: another
// writer; or the fence failed) is not prepared again: its caller learns
// ErrUnavailable and the proposal's Done hears the failure.
func (l *Log) Propose(ctx context.Context, p Proposal) (uint64, error) {
	cond := ConditionOf(ctx)
	if l.opts.Replica != nil && cond == nil {
		return 0, ErrNoProposals
	}
	r := &appendReq{prop: p, done: make(chan appendResult, 1), cond: cond}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := l.enqueue(ctx, r); err != nil {
		return 0, err
	}
	// Not abandoned on ctx: the change may already be durable, and the
	// proposal learns which through Done; the caller learns it here.
	res := <-r.done
	return res.index, res.err
}

// proposed is a proposal of a batch as the writer prepared it.
type proposed struct {
	req      *appendReq
	first    uint64
	n        int
	rev      uint64
	payload  []byte
	snapshot bool
}

// expand prepares the proposals of batch, in order, at start: each one's
// entries take its place in the batch returned, and a proposal whose
// Prepare or entries fail is answered at once and leaves no gap.
func (l *Log) expand(start uint64, batch []*appendReq) ([]*appendReq, []proposed) {
	var props []proposed
	out := batch[:0:0]
	next := start
	for _, r := range batch {
		if r.prop == nil {
			out = append(out, r)
			next++
			continue
		}
		reqs, pr, err := l.prepareProposal(r.prop, next)
		if err != nil {
			r.done <- appendResult{err: err}
			continue
		}
		for _, q := range reqs {
			q.cond = r.cond // the commit carries the proposer's fence
		}
		pr.req = r
		props = append(props, pr)
		out = append(out, reqs...)
		next += uint64(pr.n)
	}
	return out, props
}

// prepareProposal runs p's Prepare at first and encodes its entries as
// requests of the batch (answered by the proposal, not each). An entry
// without a time gets the sequencer's.
func (l *Log) prepareProposal(p Proposal, first uint64) ([]*appendReq, proposed, error) {
	pp, err := p.Prepare(first)
	if err != nil {
		return nil, proposed{}, err
	}
	fail := func(err error) ([]*appendReq, proposed, error) {
		p.Done(err)
		return nil, proposed{}, err
	}
	if len(pp.Entries) == 0 || pp.Revision == 0 {
		return fail(fmt.Errorf("%w: a proposal needs an entry and a revision", ErrInvalidEntry))
	}
	pp.Entries[0].Change = &ChangeRef{Revision: pp.Revision, Digest: PayloadDigest(pp.Payload)}
	reqs := make([]*appendReq, len(pp.Entries))
	for i := range pp.Entries {
		e := &pp.Entries[i]
		if e.Time.IsZero() {
			e.Time = l.now()
		}
		data, err := e.Encode()
		if err == nil {
			err = e.Validate()
		}
		if err != nil {
			return fail(err)
		}
		// Answered through the proposal; the channel takes the writer's
		// answer to each entry unread.
		reqs[i] = &appendReq{data: data, leaf: LeafHash(data), keys: makeIndexKeys(e), unixNano: e.Time.UnixNano(), done: make(chan appendResult, 1)}
	}
	return reqs, proposed{first: first, n: len(reqs), rev: pp.Revision, payload: pp.Payload, snapshot: pp.Snapshot}, nil
}

// putChanges stores the payloads of props beside their entries: revision
// -> the index of the entry that records it, and the payload.
func putChanges(tx *bolt.Tx, props []proposed) error {
	for _, p := range props {
		b := tx.Bucket(bucketChanges)
		if p.snapshot {
			b = tx.Bucket(bucketSnapshots)
		}
		b.FillPercent = 1 // appended in revision order
		k, _ := b.Cursor().Last()
		if k != nil && len(k) != 8 {
			return fmt.Errorf("%w: change record key %x", ErrCorrupt, k)
		}
		if k != nil && binary.BigEndian.Uint64(k) >= p.rev {
			return fmt.Errorf("%w: change revision %d after %d", ErrInvalidEntry, p.rev, binary.BigEndian.Uint64(k))
		}
		v := make([]byte, 8, 8+len(p.payload))
		binary.BigEndian.PutUint64(v, p.first)
		if err := b.Put(u64(p.rev), append(v, p.payload...)); err != nil {
			return err
		}
	}
	return nil
}

// records are props as a Commit carries them.
func records(props []proposed) []ChangeRecord {
	if len(props) == 0 {
		return nil
	}
	out := make([]ChangeRecord, len(props))
	for i, p := range props {
		out[i] = ChangeRecord{Revision: p.rev, Index: p.first, Snapshot: p.snapshot, Payload: p.payload}
	}
	return out
}

// fromRecords are a replicated commit's changes as this copy stores them,
// each checked to name an entry of the commit [start, end).
func fromRecords(start, end uint64, recs []ChangeRecord) ([]proposed, error) {
	out := make([]proposed, len(recs))
	for i, c := range recs {
		if c.Index < start || c.Index >= end || c.Revision == 0 {
			return nil, fmt.Errorf("%w: replicated change %d names entry %d outside its commit [%d, %d)", ErrCorrupt, c.Revision, c.Index, start, end)
		}
		out[i] = proposed{first: c.Index, rev: c.Revision, payload: c.Payload, snapshot: c.Snapshot}
	}
	return out, nil
}

// finish answers the proposals of a commit: Done in log order and their
// first index on success, Done in reverse order and err on failure.
func finish(props []proposed, err error) {
	if err != nil {
		for i := len(props) - 1; i >= 0; i-- {
			props[i].req.prop.Done(err)
			props[i].req.done <- appendResult{err: err}
		}
		return
	}
	for _, p := range props {
		p.req.prop.Done(nil)
		p.req.done <- appendResult{index: p.first}
	}
}

// answerUnprepared refuses proposals the writer did not prepare (the log
// failed): no Done, as after a failed Prepare.
func answerUnprepared(props []proposed, err error) {
	for _, p := range props {
		p.req.done <- appendResult{err: err}
	}
}

// Changes calls fn with each payload of a revision after from, in order,
// with the index of the entry that records it: the payloads durable when
// it began, from memory if this copy stored them all lately
// (recentChanges), else read in one transaction, each checked against its
// entry. payload is valid only during fn.
func (l *Log) Changes(ctx context.Context, from uint64, fn func(rev, index uint64, payload []byte) error) error {
	if kept, ok := l.recent.after(from); ok {
		for _, c := range kept {
			if err := fn(c.rev, c.index, c.payload); err != nil {
				return err
			}
		}
		return nil
	}
	return l.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketChanges)
		if b == nil {
			return nil // an older file, opened read-only
		}
		c := b.Cursor()
		for k, v := c.Seek(u64(from + 1)); k != nil; k, v = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if len(k) != 8 || len(v) < 8 {
				return fmt.Errorf("%w: change record %x", ErrCorrupt, k)
			}
			rev, index, payload := binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(v), v[8:]
			if err := checkRecorded(tx, rev, index, payload); err != nil {
				return err
			}
			if err := fn(rev, index, payload); err != nil {
				return err
			}
		}
		return nil
	})
}

// LastChange is the revision of the newest payload in the log (0: none).
func (l *Log) LastChange() (uint64, error) {
	var rev uint64
	err := l.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketChanges); b == nil {
			return nil
		} else if k, _ := b.Cursor().Last(); len(k) == 8 {
			rev = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return rev, err
}

// Snapshot calls fn with the newest snapshot's revision, the index of the
// entry that records it, and its payload (valid only during fn); found is
// false if the log holds none.
func (l *Log) Snapshot(fn func(rev, index uint64, payload []byte) error) (found bool, err error) {
	err = l.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b == nil {
			return nil
		}
		k, v := b.Cursor().Last()
		if k == nil {
			return nil
		}
		if len(k) != 8 || len(v) < 8 {
			return fmt.Errorf("%w: snapshot record %x", ErrCorrupt, k)
		}
		found = true
		rev, index, payload := binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(v), v[8:]
		if err := checkRecorded(tx, rev, index, payload); err != nil {
			return err
		}
		return fn(rev, index, payload)
	})
	return found, err
}

// checkRecorded refuses a payload its entry does not commit to: the entry
// at index must be in the tree (its leaf hash the tree's) and record the
// change at rev with payload's digest. The payloads sit beside the tree,
// not in it: this is what ties a replayed change to the signed log.
func checkRecorded(tx *bolt.Tx, rev, index uint64, payload []byte) error {
	var size uint64
	if v := tx.Bucket(bucketMeta).Get(metaTree); v != nil {
		s, _, err := decodeTreeState(v)
		if err != nil {
			return err
		}
		size = s
	}
	if index >= size {
		return fmt.Errorf("%w: change %d names entry %d beyond the tree (%d entries)", ErrCorrupt, rev, index, size)
	}
	data, err := readEntry(tx, index)
	if err != nil {
		return fmt.Errorf("%w: change %d: entry %d: %v", ErrCorrupt, rev, index, err)
	}
	leaf := make([][]byte, 1)
	if err := getNodes(tx, []compact.NodeID{compact.NewNodeID(0, index)}, leaf); err != nil {
		return fmt.Errorf("%w: change %d: leaf %d: %v", ErrCorrupt, rev, index, err)
	}
	if h := LeafHash(data); !bytes.Equal(h[:], leaf[0]) {
		return fmt.Errorf("%w: change %d: entry %d is not the tree's", ErrCorrupt, rev, index)
	}
	e, err := DecodeEntry(data)
	if err != nil {
		return fmt.Errorf("%w: change %d: entry %d: %v", ErrCorrupt, rev, index, err)
	}
	if c := e.Change; c == nil || c.Revision != rev || c.Digest != PayloadDigest(payload) {
		return fmt.Errorf("%w: change %d: its payload is not the one entry %d records", ErrCorrupt, rev, index)
	}
	return nil
}

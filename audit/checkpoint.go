package audit

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/transparency-dev/merkle/proof"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
)

// Checkpoint is a signed tree head: a C2SP tlog-checkpoint body
//
//	<origin>\n<tree size, decimal>\n<root hash, base64>\n
//
// signed as a C2SP signed note by the log's key under the origin as key
// name.
type Checkpoint struct {
	Origin     string
	Size       uint64
	Hash       [32]byte
	Extensions []string // extension lines after the root hash (we write none)
	Note       []byte   // the whole signed note
}

// MaxCheckpointSize bounds a checkpoint note read from anywhere.
const MaxCheckpointSize = 1 << 16

// Body returns the checkpoint text that is signed.
func (c *Checkpoint) Body() string {
	var b strings.Builder
	b.WriteString(c.Origin)
	b.WriteByte('\n')
	b.WriteString(strconv.FormatUint(c.Size, 10))
	b.WriteByte('\n')
	b.WriteString(base64.StdEncoding.EncodeToString(c.Hash[:]))
	b.WriteByte('\n')
	for _, e := range c.Extensions {
		b.WriteString(e)
		b.WriteByte('\n')
	}
	return b.String()
}

// noteText returns the text part of a signed note (up to and including the
// newline before the last blank line), or the whole input if there is no
// signature block.
func noteText(msg []byte) string {
	if i := bytes.LastIndex(msg, []byte("\n\n")); i >= 0 {
		return string(msg[:i+1])
	}
	return string(msg)
}

// parseCheckpointBody parses a tlog-checkpoint body strictly: non-empty
// origin, canonical decimal size, base64 of exactly 32 bytes, non-empty
// extension lines, final newline.
func parseCheckpointBody(text string) (Checkpoint, error) {
	var c Checkpoint
	if !strings.HasSuffix(text, "\n") {
		return c, errors.New("checkpoint body does not end in a newline")
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) < 3 {
		return c, fmt.Errorf("checkpoint body has %d lines, want at least 3", len(lines))
	}
	c.Origin = lines[0]
	if c.Origin == "" {
		return c, errors.New("checkpoint origin is empty")
	}
	s := lines[1]
	size, err := strconv.ParseUint(s, 10, 64)
	if err != nil || (len(s) > 1 && s[0] == '0') || s == "" || s[0] == '+' {
		return c, fmt.Errorf("checkpoint tree size %q is not a canonical decimal", s)
	}
	c.Size = size
	h, err := base64.StdEncoding.Strict().DecodeString(lines[2])
	if err != nil || len(h) != 32 {
		return c, errors.New("checkpoint root hash is not base64 of 32 bytes")
	}
	copy(c.Hash[:], h)
	for _, e := range lines[3:] {
		if e == "" {
			return c, errors.New("empty checkpoint extension line")
		}
		c.Extensions = append(c.Extensions, e)
	}
	return c, nil
}

// ParseCheckpoint parses a signed checkpoint note without verifying its
// signatures (for display and for fuzzing). Use OpenCheckpoint to verify.
func ParseCheckpoint(msg []byte) (Checkpoint, error) {
	if len(msg) > MaxCheckpointSize {
		return Checkpoint{}, fmt.Errorf("checkpoint of %d bytes", len(msg))
	}
	if !bytes.Contains(msg, []byte("\n\n")) {
		return Checkpoint{}, errors.New("checkpoint has no signature block")
	}
	c, err := parseCheckpointBody(noteText(msg))
	if err != nil {
		return Checkpoint{}, err
	}
	c.Note = bytes.Clone(msg)
	return c, nil
}

// OpenCheckpoint verifies a signed checkpoint with the trusted keys, bound
// to its origin as key name, and returns it with the keys whose signatures
// verified. Its errors wrap *note.UnverifiedNoteError (no signature by any
// trusted key: unknown key), *note.InvalidSignatureError (a trusted key's
// signature does not verify: bad signature) or describe a malformed note.
func OpenCheckpoint(msg []byte, keys []attest.PublicKey) (Checkpoint, []attest.PublicKey, error) {
	c, err := ParseCheckpoint(msg)
	if err != nil {
		return Checkpoint{}, nil, err
	}
	var vs []note.Verifier
	byHash := map[uint32]attest.PublicKey{}
	for _, k := range keys {
		v, err := k.NoteVerifier(c.Origin)
		if err != nil {
			return Checkpoint{}, nil, fmt.Errorf("checkpoint origin %q: %w", c.Origin, err)
		}
		if _, dup := byHash[v.KeyHash()]; dup {
			continue // the same key given twice
		}
		byHash[v.KeyHash()] = k
		vs = append(vs, v)
	}
	n, err := note.Open(msg, note.VerifierList(vs...))
	if err != nil {
		return Checkpoint{}, nil, err
	}
	var signers []attest.PublicKey
	for _, s := range n.Sigs {
		signers = append(signers, byHash[s.Hash])
	}
	return c, signers, nil
}

// LatestCheckpoint returns the most recent signed checkpoint, or
// ErrNoCheckpoint.
func (l *Log) LatestCheckpoint() (Checkpoint, error) {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	if l.latest == nil {
		return Checkpoint{}, ErrNoCheckpoint
	}
	return *l.latest, nil
}

// CheckpointAt returns the stored checkpoint of exactly size, or
// ErrNoCheckpoint.
func (l *Log) CheckpointAt(size uint64) (Checkpoint, error) {
	var c Checkpoint
	err := l.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketCheckpoints).Get(u64(size))
		if v == nil {
			return ErrNoCheckpoint
		}
		var err error
		c, err = ParseCheckpoint(v)
		return err
	})
	return c, err
}

// Checkpoint signs a checkpoint of the current tree if it grew since the
// last one (or none exists yet), stores it, and returns the latest
// checkpoint. Before signing, the new tree is proved consistent with the
// last signed checkpoint (an RFC 6962 consistency proof from the stored
// nodes, verified with the merkle proof package); an *InconsistentError
// stops it from signing a fork. Every checkpoint is kept.
func (l *Log) Checkpoint(ctx context.Context) (Checkpoint, error) {
	if l.opts.Signer == nil {
		return Checkpoint{}, ErrNoSigner
	}
	if l.opts.ReadOnly {
		return Checkpoint{}, ErrClosed
	}
	// A replicated log's checkpoint signs the whole replicated tree as
	// far as this copy can see it, and builds on the latest checkpoint
	// any replica signed.
	if err := l.Sync(ctx); err != nil {
		return Checkpoint{}, err
	}
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	size, root := l.treeHead()
	prev := l.latest
	if prev != nil && prev.Size == size {
		if prev.Hash != root {
			return Checkpoint{}, &InconsistentError{OldSize: prev.Size, NewSize: size, OldRoot: prev.Hash, NewRoot: root,
				Err: errors.New("same size, different root")}
		}
		return *prev, nil
	}
	if prev != nil {
		if prev.Size > size {
			return Checkpoint{}, &InconsistentError{OldSize: prev.Size, NewSize: size, OldRoot: prev.Hash, NewRoot: root,
				Err: errors.New("tree is smaller than the last checkpoint")}
		}
		p, err := l.ConsistencyProof(ctx, prev.Size, size)
		if err != nil {
			return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
		}
		if err := proof.VerifyConsistency(hasher, prev.Size, size, p, prev.Hash[:], root[:]); err != nil {
			return Checkpoint{}, &InconsistentError{OldSize: prev.Size, NewSize: size, OldRoot: prev.Hash, NewRoot: root, Err: err}
		}
	}

	c := Checkpoint{Origin: l.origin, Size: size, Hash: root}
	ns, err := attest.NoteSigner(ctx, l.opts.Signer, l.origin)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	msg, err := note.Sign(&note.Note{Text: c.Body()}, ns)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: sign: %w", err)
	}
	c.Note = msg
	pub := ns.PublicKey()
	pemb, err := pub.MarshalPEM()
	if err != nil {
		return Checkpoint{}, err
	}
	if err := l.storeCheckpoint(size, msg, pub.Version, pemb); err != nil {
		return Checkpoint{}, err
	}
	if l.opts.Replica != nil {
		rctx, cancel := context.WithTimeout(ctx, l.opts.ReplicaTimeout)
		err := l.opts.Replica.PutCheckpoint(rctx, ReplicatedCheckpoint{Note: msg, KeyVersion: pub.Version, KeyPEM: pemb})
		cancel()
		if err != nil {
			return Checkpoint{}, fmt.Errorf("%w: replicate checkpoint: %w", ErrUnavailable, err)
		}
	}
	l.latest = &c
	return c, nil
}

// update runs fn in a write transaction (besides the appender's; bbolt
// serializes them).
func (l *Log) update(fn func(*bolt.Tx) error) error {
	l.dbmu.RLock()
	defer l.dbmu.RUnlock()
	if l.db == nil {
		return ErrClosed
	}
	return l.db.Update(fn)
}

// SigningKeys returns the public key of every key version that signed a
// checkpoint of this log, in the order they first signed.
func (l *Log) SigningKeys() ([]attest.PublicKey, error) {
	type rec struct {
		first uint64
		key   attest.PublicKey
	}
	var recs []rec
	err := l.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
			if len(v) < 16 {
				return fmt.Errorf("%w: key record %q", ErrCorrupt, k)
			}
			pk, err := attest.ParsePublicKeyPEM(v[16:], binary.BigEndian.Uint64(v))
			if err != nil {
				return fmt.Errorf("%w: key record: %v", ErrCorrupt, err)
			}
			recs = append(recs, rec{binary.BigEndian.Uint64(v[8:]), pk})
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	for i := 1; i < len(recs); i++ {
		for j := i; j > 0 && (recs[j].first < recs[j-1].first ||
			recs[j].first == recs[j-1].first && recs[j].key.Version < recs[j-1].key.Version); j-- {
			recs[j], recs[j-1] = recs[j-1], recs[j]
		}
	}
	out := make([]attest.PublicKey, len(recs))
	for i, r := range recs {
		out[i] = r.key
	}
	return out, nil
}

// Checkpointer signs checkpoints of a Log: at least once per Interval while
// entries arrive, on demand (Log.Checkpoint), and once more when Run's
// context ends (shutdown), so that every durable entry is covered by a
// signed checkpoint when the gateway stops cleanly.
type Checkpointer struct {
	// Log is the log to sign. Required.
	Log *Log
	// Interval between checks for new entries. Zero means one second.
	Interval time.Duration
	// Tick, if set, replaces the ticker (tests drive it by hand).
	Tick <-chan time.Time
	// OnError is told about signing failures that Run retries (a signer
	// that is down). Nil ignores them. Corruption is not retried: Run
	// returns it.
	OnError func(error)
	// ShutdownTimeout bounds the final checkpoint. Zero means 10 seconds.
	ShutdownTimeout time.Duration
}

// Run signs until ctx ends, then signs a last checkpoint and returns nil,
// or the final signing error. It returns early with an error wrapping
// ErrCorrupt if the log cannot be proved consistent with its last
// checkpoint: the gateway must stop rather than keep appending to a log it
// cannot sign.
func (c *Checkpointer) Run(ctx context.Context) error {
	tick := c.Tick
	if tick == nil {
		d := c.Interval
		if d <= 0 {
			d = time.Second
		}
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			d := c.ShutdownTimeout
			if d <= 0 {
				d = 10 * time.Second
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
			defer cancel()
			_, err := c.Log.Checkpoint(sctx)
			return err
		case <-tick:
			if _, err := c.Log.Checkpoint(ctx); err != nil {
				if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrClosed) || errors.Is(err, ErrNoSigner) {
					return err
				}
				if c.OnError != nil && ctx.Err() == nil {
					c.OnError(err)
				}
			}
		}
	}
}

// Anchor is a signed checkpoint as an attestation's predicate carries it:
// the statement's proofs are against it.
type Anchor struct {
	Origin     string `json:"origin"`
	Checkpoint string `json:"checkpoint"` // the C2SP signed note
	TreeSize   uint64 `json:"tree_size"`
}

// AnchorOf is cp as an Anchor.
func AnchorOf(cp Checkpoint) Anchor {
	return Anchor{Origin: cp.Origin, Checkpoint: string(cp.Note), TreeSize: cp.Size}
}

// Open verifies the anchor's note under keys and that it is of the origin
// and size the anchor names.
func (a Anchor) Open(keys []attest.PublicKey) (Checkpoint, error) {
	cp, _, err := OpenCheckpoint([]byte(a.Checkpoint), keys)
	if err != nil {
		return Checkpoint{}, err
	}
	if cp.Size != a.TreeSize || cp.Origin != a.Origin {
		return Checkpoint{}, fmt.Errorf("the checkpoint is of %s size %d, the predicate says %s size %d", cp.Origin, cp.Size, a.Origin, a.TreeSize)
	}
	return cp, nil
}

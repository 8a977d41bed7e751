package audit

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/internal/rounds"
	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/rfc6962"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// StoreSchemaVersion is the version of the bucket layout (doc.go). Open
// refuses newer files with ErrSchemaTooNew.
const StoreSchemaVersion = 1

const logKind = "nvmegate/audit"

// Bucket names; doc.go describes keys and values.
var (
	bucketMeta        = []byte("meta")
	bucketEntries     = []byte("entries")
	bucketTiles       = []byte("tiles")
	bucketCheckpoints = []byte("checkpoints")
	bucketKeys        = []byte("keys")
	bucketIdxJob      = []byte("idx_job")
	bucketIdxTenant   = []byte("idx_tenant")
	bucketIdxNS       = []byte("idx_namespace")
	bucketIdxTime     = []byte("idx_time")
	// bucketChanges holds the payloads of sequenced proposals (Propose):
	// revision -> index of the entry that records it, and the payload.
	bucketChanges = []byte("changes")
	// bucketSnapshots holds whole states the changes start from (a
	// genesis): revision -> index of the entry that records it, and the
	// payload.
	bucketSnapshots = []byte("snapshots")

	// laterBuckets came after the first files: a file opened read-only
	// (an export of an older log) may lack them.
	laterBuckets = map[string]bool{string(bucketChanges): true, string(bucketSnapshots): true}

	allBuckets = [][]byte{
		bucketMeta, bucketEntries, bucketTiles, bucketCheckpoints, bucketKeys,
		bucketIdxJob, bucketIdxTenant, bucketIdxNS, bucketIdxTime, bucketChanges, bucketSnapshots,
	}

	metaKind   = []byte("kind")
	metaSchema = []byte("schema_version")
	metaOrigin = []byte("origin")
	metaTree   = []byte("tree")
)

// Defaults of Options.
const (
	DefaultTimeout  = time.Second
	DefaultMaxBatch = 1024
	defaultQueue    = 4096
	// mmapSize is reserved up front so that the writer rarely remaps:
	// a remap waits for every read transaction, and a long export would
	// then stall appends.
	mmapSize = 1 << 30
)

// Options configure a Log. Origin is required for a new log; the rest have
// documented defaults.
type Options struct {
	// Origin names the log: the first line of its checkpoints and the key
	// name of their signatures (C2SP tlog-checkpoint), e.g.
	// "nvmegate.example.com/audit". A new file stores it; an existing file
	// keeps its own and Open refuses a different non-empty one.
	Origin string

	// Signer signs checkpoints. Nil opens the log without signing
	// (Checkpoint returns ErrNoSigner): enough for export, query, proofs.
	Signer attest.Signer

	// Now stamps entries whose Time is zero; it is called from the
	// appending goroutines concurrently. Default time.Now.
	Now func() time.Time

	// Timeout bounds the wait for the file lock. Zero means DefaultTimeout.
	Timeout time.Duration

	// MaxBatch caps the entries committed in one transaction. Zero means
	// DefaultMaxBatch.
	MaxBatch int

	// MaxSize, if positive, caps the file size (bbolt's MaxSize): appends
	// past it fail as on a full disk. For tests and quota.
	MaxSize int

	// ReadOnly opens the file with a shared lock for export, query and
	// checks; Append and Checkpoint return ErrClosed.
	ReadOnly bool

	// Replica, if set, is the replicated log this file is a copy of
	// (replica.go): every commit is durable there before Append returns,
	// Open and Sync apply the commits of other writers, and checkpoints
	// are shared through it.
	Replica Replica
	// Forward, with a Replica, carries the appends of this replica to the
	// term's leader while another replica leads (AppendForwarder), so that
	// one writer appends: appends carrying a condition (the leader's own
	// work) are never forwarded.
	Forward AppendForwarder
	// History, with a Replica, serves the history the Replica trimmed
	// (history.go) to this copy when it lacks it: another replica's copy.
	// A replica's copy is written with fsync, as a lone log is: the copies
	// are the history's only home once the Replica trimmed it.
	History HistorySource
	// OnError hears of failures of the writer's background work (a
	// watched commit that could not be applied): the next Sync retries
	// and answers with them. Default: ignored.
	OnError func(error)

	// ReplicaTimeout bounds each call to the Replica. Zero means
	// DefaultReplicaTimeout.
	ReplicaTimeout time.Duration

	// ReplicaInFlight caps the commits sent to the Replica and not yet
	// answered (pipeline.go). Zero means DefaultReplicaInFlight; one sends
	// a commit only after the one before it is answered.
	ReplicaInFlight int

	// GroupWait bounds how long a commit to the Replica waits for appends
	// still arriving when it holds fewer than the last round had
	// (pipeline.go, gather). Zero means DefaultGroupWait; negative never
	// waits.
	GroupWait time.Duration
}

// Log is the append-only, tamper-evident audit log. Its methods are safe
// for concurrent use.
type Log struct {
	// queued are the parts of a batch cut to fit the Replica's request
	// limit (parts) still to send, each prepared on the one before: the
	// pipelined writer's alone.
	queued []*prepared
	path   string
	opts   Options
	origin string
	now    func() time.Time

	// dbmu guards db: every user holds it for reading; recovery after a
	// failed commit replaces db under the write lock.
	dbmu sync.RWMutex
	db   *bolt.DB

	// Committed tree state; only the writer changes it.
	stmu sync.RWMutex
	size uint64
	rng  *compact.Range

	reqs     chan *appendReq
	syncs    chan chan error // Sync's requests to the writer
	csyncs   chan chan error // SyncCommits'
	barriers rounds.Rounds   // Barrier's
	changed  chan struct{}   // ChangesNotify
	offers   chan []Commit   // Offer's, to the writer
	grew     chan struct{}   // closed and replaced when the tree grows (WaitSize); under stmu
	lost     atomic.Uint64   // commits the Replica refused as conflicts (LostCompares)
	recent   recentChanges   // the payloads stored last, for Changes
	closeMu  sync.RWMutex
	closed   bool
	stop     chan struct{}
	done     chan struct{}
	failed   error // sticky, set by the writer when recovery fails; guarded by closeMu
	maxBatch int
	gap      time.Duration // gather's wait for the next append: groupGap

	idx memIndex // postings not yet in the index buckets

	cpMu   sync.Mutex  // serializes checkpoint signing
	latest *Checkpoint // guarded by cpMu
}

var hasher = rfc6962.DefaultHasher

var rangeFactory = &compact.RangeFactory{Hash: hasher.HashChildren}

type appendReq struct {
	data     []byte
	leaf     [32]byte
	keys     indexKeys
	unixNano int64
	cond     any // WithCondition's, or nil
	done     chan appendResult
	prop     Proposal // a proposal: data, leaf and keys come from its Prepare
}

type appendResult struct {
	index uint64
	err   error
}

// Open opens or creates (mode 0600) the log file at path, checks it and
// loads the tree state. It starts the writer goroutine; call Close.
func Open(path string, opts Options) (*Log, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	switch {
	case opts.Timeout < 0:
		return nil, fmt.Errorf("audit: open %s: negative lock timeout", path)
	case opts.Timeout == 0:
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.ReplicaTimeout <= 0 {
		opts.ReplicaTimeout = DefaultReplicaTimeout
	}
	if opts.ReplicaInFlight <= 0 {
		opts.ReplicaInFlight = DefaultReplicaInFlight
	}
	if opts.GroupWait == 0 {
		opts.GroupWait = DefaultGroupWait
	}
	if opts.Origin != "" && !validOrigin(opts.Origin) {
		return nil, fmt.Errorf("audit: open %s: invalid origin %q (no spaces, '+' or control characters)", path, opts.Origin)
	}
	l := &Log{
		path:     path,
		opts:     opts,
		now:      opts.Now,
		reqs:     make(chan *appendReq, defaultQueue),
		syncs:    make(chan chan error),
		csyncs:   make(chan chan error),
		changed:  make(chan struct{}, 1),
		offers:   make(chan []Commit, 256),
		grew:     make(chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		maxBatch: opts.MaxBatch,
		gap:      groupGap,
	}
	err := l.openAndLoad()
	if err != nil && opts.Replica != nil && !opts.ReadOnly && damaged(err) {
		// A replica's copy that does not open as a log (a disk fault, a
		// copy written without fsync by an older version): set it aside
		// and fill a new one from the replicated log and the other
		// copies (history.go).
		aside := fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		err = l.openAndLoad()
	}
	if err != nil {
		return nil, err
	}
	if opts.ReadOnly {
		l.closed = true
		close(l.done)
		return l, nil
	}
	if opts.Replica != nil {
		// A new replica's copy starts empty and fills from the replicated
		// log; a restarted one applies what it missed.
		if err := l.catchUp(); err != nil {
			_ = l.db.Close()
			return nil, fmt.Errorf("audit: open %s: %w", path, err)
		}
	}
	go l.writer()
	return l, nil
}

// openAndLoad opens the file and loads its state into l.
func (l *Log) openAndLoad() error {
	db, err := l.openDB()
	if err != nil {
		return err
	}
	l.db = db
	if err := l.load(); err != nil {
		_ = db.Close()
		l.db = nil
		return err
	}
	return nil
}

// damaged says whether err is a file that is not a consistent log (not a
// lock held, nor another log's or program's file).
func damaged(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) ||
		errors.Is(err, berrors.ErrVersionMismatch)
}

func (l *Log) openDB() (*bolt.DB, error) {
	bo := &bolt.Options{
		Timeout:         l.opts.Timeout,
		ReadOnly:        l.opts.ReadOnly,
		InitialMmapSize: mmapSize,
		MaxSize:         l.opts.MaxSize,
		FreelistType:    bolt.FreelistMapType,
	}
	db, err := bolt.Open(l.path, 0o600, bo)
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("audit: open %s: %w (waited %s)", l.path, ErrLocked, l.opts.Timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: %w", l.path, err)
	}
	if !l.opts.ReadOnly {
		if err := db.Update(l.initSchema); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("audit: open %s: %w", l.path, err)
		}
	}
	return db, nil
}

func (l *Log) initSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		if k, _ := tx.Cursor().First(); k != nil {
			return fmt.Errorf("%w: it has buckets but no %q bucket", ErrNotAuditLog, bucketMeta)
		}
		if l.opts.Origin == "" {
			return fmt.Errorf("a new audit log needs Options.Origin")
		}
		var err error
		if meta, err = tx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		for k, v := range map[string][]byte{
			string(metaKind):   []byte(logKind),
			string(metaSchema): u64(StoreSchemaVersion),
			string(metaOrigin): []byte(l.opts.Origin),
			string(metaTree):   u64(0),
		} {
			if err := meta.Put([]byte(k), v); err != nil {
				return err
			}
		}
	}
	if err := checkMeta(meta, l.opts.Origin); err != nil {
		return err
	}
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

func checkMeta(meta *bolt.Bucket, origin string) error {
	if meta == nil {
		return fmt.Errorf("%w: no %q bucket", ErrNotAuditLog, bucketMeta)
	}
	if kind := meta.Get(metaKind); string(kind) != logKind {
		return fmt.Errorf("%w: kind is %q", ErrNotAuditLog, kind)
	}
	v := meta.Get(metaSchema)
	if len(v) != 8 {
		return fmt.Errorf("%w: schema version of %d bytes", ErrCorrupt, len(v))
	}
	switch version := binary.BigEndian.Uint64(v); {
	case version > StoreSchemaVersion:
		return fmt.Errorf("%w: file has version %d, this binary knows up to %d", ErrSchemaTooNew, version, StoreSchemaVersion)
	case version < 1:
		return fmt.Errorf("%w: schema version %d", ErrCorrupt, version)
	}
	if o := meta.Get(metaOrigin); origin != "" && string(o) != origin {
		return fmt.Errorf("origin mismatch: the log is %q, Options.Origin is %q", o, origin)
	}
	return nil
}

// load reads the tree state and latest checkpoint, and checks that the
// tree state agrees with the entries and nodes stored.
func (l *Log) load() error {
	return l.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := checkMeta(meta, ""); err != nil {
			return fmt.Errorf("audit: open %s: %w", l.path, err)
		}
		for _, name := range allBuckets {
			if tx.Bucket(name) == nil && !laterBuckets[string(name)] {
				return fmt.Errorf("audit: open %s: %w: bucket %s missing", l.path, ErrCorrupt, name)
			}
		}
		l.origin = string(meta.Get(metaOrigin))
		size, rng, err := decodeTreeState(meta.Get(metaTree))
		if err != nil {
			return fmt.Errorf("audit: open %s: %w", l.path, err)
		}
		if err := checkStoredTree(tx, size, rng); err != nil {
			return fmt.Errorf("audit: open %s: %w", l.path, err)
		}
		l.size, l.rng = size, rng
		if err := l.rebuildMemIndex(tx); err != nil {
			return fmt.Errorf("audit: open %s: %w", l.path, err)
		}
		if k, v := tx.Bucket(bucketCheckpoints).Cursor().Last(); k != nil {
			cp, err := parseCheckpointBody(noteText(v))
			if err != nil {
				return fmt.Errorf("audit: open %s: %w: latest checkpoint: %v", l.path, ErrCorrupt, err)
			}
			cp.Note = append([]byte(nil), v...)
			if cp.Size > size {
				return fmt.Errorf("audit: open %s: %w: checkpoint of size %d beyond tree size %d", l.path, ErrCorrupt, cp.Size, size)
			}
			l.latest = &cp
		}
		return nil
	})
}

func decodeTreeState(v []byte) (uint64, *compact.Range, error) {
	if len(v) < 8 || (len(v)-8)%32 != 0 {
		return 0, nil, fmt.Errorf("%w: tree state of %d bytes", ErrCorrupt, len(v))
	}
	size := binary.BigEndian.Uint64(v)
	var hashes [][]byte
	for p := v[8:]; len(p) > 0; p = p[32:] {
		hashes = append(hashes, append([]byte(nil), p[:32]...))
	}
	rng, err := rangeFactory.NewRange(0, size, hashes)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: tree state: %v", ErrCorrupt, err)
	}
	return size, rng, nil
}

func encodeTreeState(size uint64, rng *compact.Range) []byte {
	hs := rng.Hashes()
	b := make([]byte, 8, 8+32*len(hs))
	binary.BigEndian.PutUint64(b, size)
	for _, h := range hs {
		b = append(b, h...)
	}
	return b
}

// Origin returns the log's origin line.
func (l *Log) Origin() string { return l.origin }

// Size returns the number of durable entries.
func (l *Log) Size() uint64 {
	l.stmu.RLock()
	defer l.stmu.RUnlock()
	return l.size
}

// treeHead returns the committed size and root hash.
func (l *Log) treeHead() (uint64, [32]byte) {
	l.stmu.RLock()
	defer l.stmu.RUnlock()
	return l.size, rootOf(l.rng)
}

func rootOf(rng *compact.Range) [32]byte {
	var out [32]byte
	if rng.End() == 0 {
		copy(out[:], hasher.EmptyRoot())
		return out
	}
	r, err := rng.GetRootHash(nil)
	if err != nil {
		panic(err) // the range always starts at 0
	}
	copy(out[:], r)
	return out
}

// Close stops accepting appends, commits the ones already queued, and
// closes the file. It does not sign a final checkpoint: the Checkpointer
// does that when its context ends, before Close.
func (l *Log) Close() error {
	l.closeMu.Lock()
	wasClosed := l.closed
	l.closed = true
	l.closeMu.Unlock()
	if !wasClosed {
		close(l.stop)
	}
	<-l.done
	l.dbmu.Lock()
	defer l.dbmu.Unlock()
	if l.db == nil {
		return nil
	}
	// Write the memory index so that the next Open need not rebuild it.
	// Best effort: Open rebuilds it from the entries if this fails.
	l.closeMu.RLock()
	failed := l.failed
	l.closeMu.RUnlock()
	if !l.opts.ReadOnly && failed == nil && l.idx.n > 0 {
		size := l.Size()
		_ = l.db.Update(func(tx *bolt.Tx) error { return l.idx.flushTo(tx, nil, size, size) })
	}
	err := l.db.Close()
	l.db = nil
	if err != nil {
		return fmt.Errorf("audit: close: %w", err)
	}
	return nil
}

// view runs fn in a read transaction on the current file.
func (l *Log) view(fn func(*bolt.Tx) error) error {
	l.dbmu.RLock()
	defer l.dbmu.RUnlock()
	if l.db == nil {
		return ErrClosed
	}
	return l.db.View(fn)
}

// Append records e and returns its index and RFC 6962 leaf hash once the
// entry is durable: committed to the file and fsync'd. Concurrent appends
// share commits (group commit): a lone append commits at once, with no
// timer; appends that arrive during a commit go in the next one together.
//
// A zero e.Time is set from Options.Now. An invalid entry or one carrying
// key material is refused (ErrInvalidEntry, ErrKeyMaterial) before anything
// is written. Any other error means the entry is not known to be durable:
// the caller must fail closed (deny). If ctx ends while the commit is in
// flight, Append returns ctx.Err() and the entry may still be recorded.
func (l *Log) Append(ctx context.Context, e Entry) (uint64, [32]byte, error) {
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	if e.Change != nil {
		// Only a proposal's entry records a change: one without its
		// payload beside it would claim a change the log does not hold.
		return 0, [32]byte{}, fmt.Errorf("%w: an appended entry carries no change (Propose records changes)", ErrInvalidEntry)
	}
	// Encode first: it checks every string for key material, which must
	// be named as such whatever else is wrong with the entry.
	data, err := e.Encode()
	if err != nil {
		return 0, [32]byte{}, err
	}
	if err := e.Validate(); err != nil {
		return 0, [32]byte{}, err
	}
	cond := ctx.Value(conditionKey{})
	if f := l.opts.Forward; f != nil && cond == nil {
		// A replica that does not lead: the leader appends it.
		idx, handled, err := f.ForwardAppend(ctx, data)
		if handled {
			if err == nil {
				// Read your writes: this copy holds it before the
				// caller asks for its proof.
				err = l.syncTo(ctx, idx+1)
			}
			return idx, LeafHash(data), err
		}
	}
	return l.appendData(ctx, data, &e, cond)
}

// appendData queues encoded entry data (e decoded) and waits for its
// index.
func (l *Log) appendData(ctx context.Context, data []byte, e *Entry, cond any) (uint64, [32]byte, error) {
	r := &appendReq{data: data, leaf: LeafHash(data), done: make(chan appendResult, 1), cond: cond}
	r.keys = makeIndexKeys(e)
	r.unixNano = e.Time.UnixNano()
	if err := ctx.Err(); err != nil {
		return 0, [32]byte{}, err
	}
	if err := l.enqueue(ctx, r); err != nil {
		return 0, [32]byte{}, err
	}

	select {
	case res := <-r.done:
		if res.err != nil {
			return 0, [32]byte{}, res.err
		}
		return res.index, r.leaf, nil
	case <-ctx.Done():
		return 0, [32]byte{}, ctx.Err()
	}
}

// enqueue hands r to the writer, unless the log is closed or failed.
func (l *Log) enqueue(ctx context.Context, r *appendReq) error {
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed {
		if l.failed != nil {
			return l.failed
		}
		return ErrClosed
	}
	select {
	case l.reqs <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writer is the single goroutine that commits appends. It takes the first
// queued request, drains whatever else is queued (up to MaxBatch) without
// waiting, and commits them in one transaction; appends that arrive during
// that commit form the next batch. One appender thus never waits for a
// timer, and many appenders share each fsync.
func (l *Log) writer() {
	if l.opts.Replica != nil {
		l.pipelinedWriter()
		return
	}
	defer close(l.done)
	batch := make([]*appendReq, 0, l.maxBatch)
	for {
		select {
		case done := <-l.syncs:
			done <- l.syncNow(false)
			continue
		case done := <-l.csyncs:
			done <- nil // no Replica: nothing to catch up with
			continue
		case r := <-l.reqs:
			batch = append(batch[:0], r)
		case <-l.stop:
			l.commitQueued()
			return
		}
		l.commit(l.fill(batch))
	}
}

// commitQueued commits the requests still queued when the log closes:
// appenders that got past the closed check have queued them.
func (l *Log) commitQueued() {
	for {
		select {
		case r := <-l.reqs:
			l.commit(l.fill([]*appendReq{r}))
		default:
			return
		}
	}
}

// fill adds to batch, which holds one request, whatever else is queued,
// up to the batch limits, without waiting.
func (l *Log) fill(batch []*appendReq) []*appendReq {
	bytes := len(batch[0].data)
	for len(batch) < l.maxBatch && bytes < l.maxBatchBytes() {
		select {
		case r := <-l.reqs:
			batch = append(batch, r)
			bytes += 2 + len(r.data)
		default:
			return batch
		}
	}
	return batch
}

// maxBatchBytes caps a commit's entry bytes: a replicated commit is one
// request to the replica, which has a size limit.
func (l *Log) maxBatchBytes() int {
	if l.opts.Replica != nil {
		return maxReplicatedBatchBytes / l.opts.ReplicaInFlight
	}
	return int(^uint(0) >> 1)
}

// syncNow runs a Sync's catch-up in the writer (with the checkpoints, or
// the commits alone), unless the log failed.
func (l *Log) syncNow(commitsOnly bool) error {
	l.closeMu.RLock()
	failed := l.failed
	l.closeMu.RUnlock()
	if failed != nil {
		return failed
	}
	if commitsOnly {
		return l.catchUpCommits()
	}
	return l.catchUp()
}

// flushDue says whether the commit of n more entries flushes the
// in-memory postings to the index buckets.
func (l *Log) flushDue(n int) bool {
	l.idx.mu.RLock()
	defer l.idx.mu.RUnlock()
	return l.idx.n+n >= indexFlushEntries
}

// advance makes a committed batch [start, rng.End()) the log's state.
func (l *Log) advance(start uint64, rng *compact.Range, batch []*appendReq, flush bool) {
	end := rng.End()
	l.idx.mu.Lock()
	if flush {
		l.idx.reset(end)
	} else {
		for i, r := range batch {
			l.idx.add(start+uint64(i), &r.keys)
		}
	}
	l.idx.mu.Unlock()
	l.stmu.Lock()
	l.size = end
	l.rng = rng
	close(l.grew)
	l.grew = make(chan struct{})
	l.stmu.Unlock()
}

// commit writes batch in one transaction and answers every request.
func (l *Log) commit(batch []*appendReq) {
	l.closeMu.RLock()
	failed := l.failed
	l.closeMu.RUnlock()
	if failed != nil {
		for _, r := range batch {
			if r.prop == nil {
				r.done <- appendResult{err: failed}
			}
		}
		var props []proposed
		for _, r := range batch {
			if r.prop != nil {
				props = append(props, proposed{req: r})
			}
		}
		answerUnprepared(props, failed)
		return
	}

	// Proposals are prepared once, at the index the tree has now: on a
	// replicated log only the term's leader proposes, and a commit the
	// Replica refuses fails them rather than preparing them again.
	l.stmu.RLock()
	size := l.size
	l.stmu.RUnlock()
	var props []proposed
	if batch, props = l.expand(size, batch); len(batch) == 0 {
		return
	}

	var (
		start uint64
		rng   *compact.Range
		flush bool
		err   error
	)
	for round := 0; ; round++ {
		l.stmu.RLock()
		start, rng = l.size, cloneRange(l.rng)
		l.stmu.RUnlock()
		flush = l.flushDue(len(batch))
		var replicate func(Commit) error
		if l.opts.Replica != nil {
			replicate = func(c Commit) error {
				ctx, cancel := l.replicaCtx()
				defer cancel()
				return l.countLost(l.opts.Replica.Append(ctx, c))
			}
		}
		l.dbmu.RLock()
		err = l.db.Update(func(tx *bolt.Tx) error {
			return l.writeBatch(tx, start, rng, batch, props, flush, replicate)
		})
		l.dbmu.RUnlock()
		if errors.Is(err, ErrFenced) && len(props) == 0 {
			// Refuse the appends whose condition failed; commit the rest.
			var rest []*appendReq
			for _, r := range batch {
				if r.cond != nil {
					r.done <- appendResult{err: fmt.Errorf("%w: %w", ErrUnavailable, err)}
				} else {
					rest = append(rest, r)
				}
			}
			if len(rest) > 0 && len(rest) < len(batch) {
				l.commit(rest)
			}
			return
		}
		if !errors.Is(err, ErrConflict) || round == maxConflicts || len(props) > 0 {
			break
		}
		// Another writer appended first: apply its commits, then append
		// this batch on top of them.
		if err = l.applyConflict(err); err != nil {
			break
		}
	}

	if err != nil {
		err = fmt.Errorf("%w: commit of %d entries at index %d: %w", ErrUnavailable, len(batch), start, err)
		// The file may hold the batch all the same (a commit can fail
		// after its meta page was written): recovery reopens it, and what
		// it holds is the answer — a proposal told it failed must not be
		// replayed from the log later, nor its revision reused.
		l.recoverAfter(err)
		if l.holds(start, batch) {
			for i, r := range batch {
				r.done <- appendResult{index: start + uint64(i)}
			}
			finish(props, nil)
			l.stored(props)
			return
		}
		for _, r := range batch {
			r.done <- appendResult{err: err}
		}
		finish(props, err)
		return
	}
	l.advance(start, rng, batch, flush)
	for i, r := range batch {
		r.done <- appendResult{index: start + uint64(i)}
	}
	finish(props, nil)
	l.stored(props)
}

// writeBatch stores batch at start, growing rng over it. With replicate
// (this writer's own commit to a Replica), the commit is made durable
// there last, once everything else of the transaction is written.
func (l *Log) writeBatch(tx *bolt.Tx, start uint64, rng *compact.Range, batch []*appendReq, props []proposed, flush bool, replicate func(Commit) error) error {
	p, err := prepare(start, rng, batch)
	if err != nil {
		return err
	}
	p.props = props
	if err := l.put(tx, p, flush); err != nil {
		return err
	}
	if replicate != nil {
		return replicate(p.commit())
	}
	return nil
}

// prepared is a batch made ready to store at start: its entries as one
// chunk, the tile nodes it adds, and the tree after it.
type prepared struct {
	batch          []*appendReq
	start          uint64
	rng            *compact.Range // the tree after the batch
	prevRoot, root [32]byte
	chunk          []byte
	fresh          [8][][]byte // new nodes at tile levels (tree levels 0, 8, 16, …), in index order per level
	props          []proposed  // the proposals whose entries the batch holds, with their payloads
}

// prepare grows rng, the tree of start entries, over batch.
func prepare(start uint64, rng *compact.Range, batch []*appendReq) (*prepared, error) {
	p := &prepared{batch: batch, start: start, rng: rng, prevRoot: rootOf(rng)}
	size := 0
	for _, r := range batch {
		size += 2 + len(r.data)
	}
	p.chunk = make([]byte, 0, size)
	visit := func(id compact.NodeID, h []byte) {
		if id.Level%8 == 0 {
			p.fresh[id.Level/8] = append(p.fresh[id.Level/8], h)
		}
	}
	for _, r := range batch {
		p.chunk = appendRecord(p.chunk, r.data)
		if err := rng.Append(r.leaf[:], visit); err != nil {
			return nil, err
		}
	}
	p.root = rootOf(rng)
	return p, nil
}

// put writes p into this copy: the chunk keyed by its first index, the
// tiles, the time index, the postings if flush, and the tree state.
func (l *Log) put(tx *bolt.Tx, p *prepared, flush bool) error {
	if err := putChunk(tx, p.start, p.chunk); err != nil {
		return err
	}
	if err := putChanges(tx, p.props); err != nil {
		return err
	}
	if err := putTiles(tx.Bucket(bucketTiles), p.start, p.rng.End(), p.fresh[:]); err != nil {
		return err
	}
	times := tx.Bucket(bucketIdxTime)
	times.FillPercent = 1
	if err := times.Put(u64(p.start), timeRecord(p.batch)); err != nil {
		return err
	}
	if flush {
		if err := l.idx.flushTo(tx, p.batch, p.start, p.rng.End()); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketMeta).Put(metaTree, encodeTreeState(p.rng.End(), p.rng))
}

// commit is p as a Commit to a Replica, under the conditions its appenders
// set.
func (p *prepared) commit() Commit {
	var conds []any
	seen := map[any]bool{}
	for _, r := range p.batch {
		if r.cond == nil {
			continue
		}
		if reflect.TypeOf(r.cond).Comparable() { // one term's fence, once
			if seen[r.cond] {
				continue
			}
			seen[r.cond] = true
		}
		conds = append(conds, r.cond)
	}
	return Commit{Start: p.start, End: p.rng.End(), PrevRoot: p.prevRoot, Root: p.root, Records: p.chunk, Conditions: conds, Changes: records(p.props)}
}

// putTiles appends the new node hashes of each tile level to its tiles.
// Tile level L holds the tree level 8L nodes; growing the tree from start
// to end leaves created nodes [start>>8L, end>>8L) at that level.
func putTiles(b *bolt.Bucket, start, end uint64, fresh [][][]byte) error {
	for tl, hs := range fresh {
		if len(hs) == 0 {
			continue
		}
		shift := 8 * uint(tl)
		first, last := start>>shift, end>>shift
		if last-first != uint64(len(hs)) {
			return fmt.Errorf("%w: %d new nodes at tile level %d, want %d", ErrCorrupt, len(hs), tl, last-first)
		}
		for idx := first; idx < last; {
			n := idx / TileWidth
			k := tileKey(uint(tl), n)
			old := b.Get(k)
			if uint64(len(old)) != (idx%TileWidth)*32 {
				return fmt.Errorf("%w: tile %d/%d has %d hashes, want %d", ErrCorrupt, tl, n, len(old)/32, idx%TileWidth)
			}
			stop := min(last, (n+1)*TileWidth)
			t := make([]byte, 0, (stop-n*TileWidth)*32)
			t = append(t, old...)
			for ; idx < stop; idx++ {
				t = append(t, hs[idx-first]...)
			}
			if err := b.Put(k, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStoredTree checks that the entries end at size and that the tree
// state is made of the stored nodes.
func checkStoredTree(tx *bolt.Tx, size uint64, rng *compact.Range) error {
	k, _ := tx.Bucket(bucketEntries).Cursor().Last()
	var v []byte
	if k != nil {
		v = chunkData(tx.Bucket(bucketEntries), k)
	}
	switch {
	case size == 0 && k != nil:
		return fmt.Errorf("%w: entries stored beyond the tree (size 0)", ErrCorrupt)
	case size > 0:
		if len(k) != 8 {
			return fmt.Errorf("%w: no entries, tree size %d", ErrCorrupt, size)
		}
		recs, err := splitRecords(v)
		if err != nil {
			return fmt.Errorf("%w: last entry chunk: %v", ErrCorrupt, err)
		}
		if end := binary.BigEndian.Uint64(k) + uint64(len(recs)); end != size {
			return fmt.Errorf("%w: entries end at %d, tree size is %d", ErrCorrupt, end, size)
		}
	}
	nr := newNodeReader(tx)
	for i, id := range compact.RangeNodes(0, size, nil) {
		h, err := nr.node(id.Level, id.Index)
		if err != nil {
			return err
		}
		if !bytes.Equal(h, rng.Hashes()[i]) {
			return fmt.Errorf("%w: tree state disagrees with stored node (%d,%d)", ErrCorrupt, id.Level, id.Index)
		}
	}
	return nil
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func cloneRange(r *compact.Range) *compact.Range {
	hs := make([][]byte, len(r.Hashes()))
	copy(hs, r.Hashes()) // the hashes themselves are never modified in place
	c, err := rangeFactory.NewRange(r.Begin(), r.End(), hs)
	if err != nil {
		panic(err) // same shape as r
	}
	return c
}

// recoverAfter reopens the file after a failed commit. bbolt rolled the
// transaction back in memory, but if the failure came after its meta page
// reached the page cache (a failed fsync), the file may already describe
// the new tree while bbolt's free list says its pages are free. Reopening
// rebuilds bbolt's view from the file, and load re-checks the tree state
// against the stored nodes. If that fails the log refuses every later
// append (ErrFailed).
func (l *Log) recoverAfter(cause error) {
	// Lock order everywhere: cpMu, dbmu, stmu.
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	l.dbmu.Lock()
	defer l.dbmu.Unlock()
	l.recent.reset()
	_ = l.db.Close()
	l.db = nil
	fail := func(err error) {
		l.closeMu.Lock()
		l.failed = fmt.Errorf("%w: after %v: %w", ErrFailed, cause, err)
		l.closeMu.Unlock()
	}
	db, err := l.openDB()
	if err != nil {
		fail(err)
		return
	}
	l.db = db
	l.stmu.Lock()
	defer l.stmu.Unlock()
	if err := l.load(); err != nil {
		fail(err)
	}
}

// holds reports whether the log, as recovery reloaded it, holds batch at
// start: the tree covers it and its leaves are the batch's.
func (l *Log) holds(start uint64, batch []*appendReq) bool {
	l.closeMu.RLock()
	failed := l.failed
	l.closeMu.RUnlock()
	if failed != nil || l.Size() < start+uint64(len(batch)) {
		return false
	}
	for i, r := range batch {
		h, err := l.LeafHashAt(start + uint64(i))
		if err != nil || h != r.leaf {
			return false
		}
	}
	return true
}

// validOrigin applies the note key-name rules to the origin (it is both).
func validOrigin(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == '+' || r == 0x7f || r == 0x2014 {
			return false
		}
	}
	return true
}

package audit

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/transparency-dev/merkle/compact"
	"golang.org/x/mod/sumdb/note"
)

// Kind names one kind of verification failure. The strings are stable (the
// CLI's JSON report carries them).
type Kind string

// Failure kinds.
const (
	// KindModifiedEntry: an entry's bytes differ from what the log
	// committed (its hash is not the committed leaf hash).
	KindModifiedEntry Kind = "modified_entry"
	// KindMissingEntry: the entry committed at an index is nowhere in the
	// log (a hole, or removed with the later entries moved up). An entry
	// found at another index is reordered instead.
	KindMissingEntry Kind = "missing_entry"
	// KindReorderedEntry: an entry is the one committed at another index,
	// and no missing or inserted entry before it explains the move (two
	// swapped entries, adjacent or not, are both reordered).
	KindReorderedEntry Kind = "reordered_entry"
	// KindExtraEntry: entries were added that no signed checkpoint covers
	// (appended or inserted by hand).
	KindExtraEntry Kind = "extra_entry"
	// KindMalformedEntry: an entry is not a canonical entry encoding.
	KindMalformedEntry Kind = "malformed_entry"
	// KindMissingTile: a hash tile or entry bundle is missing.
	KindMissingTile Kind = "missing_tile"
	// KindTileMismatch: a hash tile disagrees with the entries or the
	// tiles below it.
	KindTileMismatch Kind = "tile_mismatch"
	// KindTruncated: the log ends before the size its checkpoint signs.
	KindTruncated Kind = "truncated"
	// KindRootMismatch: the tree does not hash to the signed root.
	KindRootMismatch Kind = "root_mismatch"
	// KindInconsistent: the log is not an extension of an earlier signed
	// checkpoint (a fork: history was rewritten).
	KindInconsistent Kind = "inconsistent_checkpoint"
	// KindRollback: the checkpoint is older (smaller) than an earlier one
	// (a rollback, or a checkpoint replaced by an older one).
	KindRollback Kind = "rollback"
	// KindBadSignature: a signature by a trusted key does not verify.
	KindBadSignature Kind = "bad_signature"
	// KindUnknownKey: a checkpoint carries no signature by a trusted key.
	KindUnknownKey Kind = "unknown_key"
	// KindMalformedCheckpoint: a checkpoint cannot be parsed.
	KindMalformedCheckpoint Kind = "malformed_checkpoint"
	// KindMissingCheckpoint: there is no checkpoint.
	KindMissingCheckpoint Kind = "missing_checkpoint"
)

// Failure is one finding of Verify or CheckFile.
type Failure struct {
	Kind Kind `json:"kind"`
	// Index is the entry index concerned, if any.
	Index *uint64 `json:"index,omitempty"`
	// Location is the file in the export ("tile/entries/000.p/17",
	// "checkpoint") or, for CheckFile, "entries/<index>", "tiles/<L>/<N>".
	Location string `json:"location,omitempty"`
	Detail   string `json:"detail"`
}

func (f Failure) Error() string {
	var b strings.Builder
	b.WriteString(string(f.Kind))
	if f.Index != nil {
		b.WriteString(" at index ")
		b.WriteString(strconv.FormatUint(*f.Index, 10))
	}
	if f.Location != "" {
		b.WriteString(" (")
		b.WriteString(f.Location)
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(f.Detail)
	return b.String()
}

// KeyInfo describes a key without key material.
type KeyInfo struct {
	Algorithm attest.Algorithm `json:"algorithm"`
	Version   uint64           `json:"version"`
	KeyID     string           `json:"key_id"`
}

// Report is the result of an offline verification. It is OK when it has no
// failures.
type Report struct {
	Origin      string    `json:"origin"`
	TreeSize    uint64    `json:"tree_size"`
	RootHash    string    `json:"root_hash"` // hex
	SignedBy    []KeyInfo `json:"signed_by"`
	Entries     uint64    `json:"entries_verified"`
	Checkpoints int       `json:"checkpoints_verified"`
	Failures    []Failure `json:"failures"`
	// Omitted counts failures left out of Failures (at most maxFailures
	// are listed).
	Omitted int `json:"omitted_failures,omitempty"`
}

const maxFailures = 1000

// OK reports whether everything verified.
func (r *Report) OK() bool { return len(r.Failures) == 0 && r.Omitted == 0 }

// Err returns nil for an OK report, else a *VerifyError.
func (r *Report) Err() error {
	if r.OK() {
		return nil
	}
	return &VerifyError{Report: r}
}

// Has reports whether the report lists a failure of kind k.
func (r *Report) Has(k Kind) bool {
	for _, f := range r.Failures {
		if f.Kind == k {
			return true
		}
	}
	return false
}

func (r *Report) add(f Failure) {
	if len(r.Failures) >= maxFailures {
		r.Omitted++
		return
	}
	r.Failures = append(r.Failures, f)
}

// VerifyError is the error of a report with failures.
type VerifyError struct{ Report *Report }

func (e *VerifyError) Error() string {
	r := e.Report
	n := len(r.Failures) + r.Omitted
	if n == 0 {
		return "audit: verification failed"
	}
	return fmt.Sprintf("audit: verification failed with %d finding(s), first: %v", n, r.Failures[0])
}

// ProgressFunc is told how many of the total entries were verified so far.
// It is called from the verifying goroutine; keep it cheap.
type ProgressFunc func(done, total uint64)

func idx(i uint64) *uint64 { return &i }

// tlogSource is what the verifier reads: an export directory or a bbolt
// file.
type tlogSource interface {
	// checkpoint returns the checkpoint to verify, with its location.
	checkpoint() ([]byte, string, error)
	// history returns earlier checkpoints with their locations.
	history() ([]located, error)
	// bundle returns the entry records of bundle n, expected to hold width
	// entries. A nil record is a known hole (bbolt); fewer records than
	// width are missing at the end. found is false if the bundle is
	// missing altogether.
	// buf may be used (and grown) to read into; the records may point
	// into it.
	bundle(n uint64, width int, buf *[]byte) (recs [][]byte, loc string, found bool, err error)
	// tile returns hash tile (level, n) of the given width.
	tile(level uint, n uint64, width int) (hashes []byte, loc string, found bool, err error)
	// beyond returns the locations of entries stored beyond size.
	beyond(size uint64) ([]string, error)
}

type located struct {
	data []byte
	loc  string
}

// Verify checks an export directory (see Export) offline, trusting only
// keys: the checkpoint's signature, every entry against the signed root,
// every hash tile, every earlier checkpoint in the export, and — if since
// is not nil — that the log extends since, a checkpoint the auditor kept
// from before. It returns a report listing every failure found; the error
// is only for failures to run (ctx ended).
func Verify(ctx context.Context, dir string, keys []attest.PublicKey, since []byte, progress ProgressFunc) (*Report, error) {
	return verify(ctx, &dirSource{root: dir}, keys, since, progress)
}

// checkpointFailure turns an OpenCheckpoint error into a failure.
func checkpointFailure(err error, loc string) Failure {
	var unv *note.UnverifiedNoteError
	var inv *note.InvalidSignatureError
	switch {
	case errors.As(err, &unv):
		var sigs []string
		for _, s := range unv.Note.UnverifiedSigs {
			sigs = append(sigs, fmt.Sprintf("%s+%08x", s.Name, s.Hash))
		}
		return Failure{Kind: KindUnknownKey, Location: loc, Detail: "no signature by a trusted key; signed by " + strings.Join(sigs, ", ")}
	case errors.As(err, &inv):
		return Failure{Kind: KindBadSignature, Location: loc, Detail: fmt.Sprintf("signature by trusted key %s+%08x does not verify", inv.Name, inv.Hash)}
	default:
		return Failure{Kind: KindMalformedCheckpoint, Location: loc, Detail: err.Error()}
	}
}

// openChecked verifies a checkpoint and reports the failure; it returns the
// parsed checkpoint when the body at least parses (so that structure can
// still be checked), and whether the signature verified.
func openChecked(r *Report, msg []byte, loc string, keys []attest.PublicKey) (Checkpoint, []attest.PublicKey, bool, bool) {
	cp, signers, err := OpenCheckpoint(msg, keys)
	if err == nil {
		return cp, signers, true, true
	}
	r.add(checkpointFailure(err, loc))
	cp, perr := ParseCheckpoint(msg)
	return cp, nil, perr == nil, false
}

// leafSlot is the verifier's view of one leaf.
type leafSlot struct {
	e, t       [32]byte
	hasE, hasT bool
	bundleGone bool // the whole bundle is missing (reported once)
}

func verify(ctx context.Context, src tlogSource, keys []attest.PublicKey, since []byte, progress ProgressFunc) (*Report, error) {
	r := &Report{Failures: []Failure{}}
	msg, loc, err := src.checkpoint()
	if err != nil {
		r.add(Failure{Kind: KindMissingCheckpoint, Location: loc, Detail: err.Error()})
		return r, nil
	}
	cp, signers, parsed, _ := openChecked(r, msg, loc, keys)
	if !parsed {
		return r, nil
	}
	for _, k := range signers {
		r.SignedBy = append(r.SignedBy, KeyInfo{Algorithm: k.Algorithm, Version: k.Version, KeyID: k.KeyID()})
	}
	r.Origin, r.TreeSize, r.RootHash = cp.Origin, cp.Size, hex.EncodeToString(cp.Hash[:])
	size := cp.Size

	// Earlier checkpoints: the export's own history and the auditor's.
	type earlier struct {
		cp  Checkpoint
		loc string
	}
	var checks []earlier
	hist, err := src.history()
	if err != nil {
		return nil, err
	}
	if since != nil {
		hist = append(hist, located{since, "since"})
	}
	for _, h := range hist {
		c, _, ok, _ := openChecked(r, h.data, h.loc, keys)
		if !ok {
			continue
		}
		r.Checkpoints++
		switch {
		case c.Origin != cp.Origin:
			r.add(Failure{Kind: KindInconsistent, Location: h.loc, Detail: fmt.Sprintf("origin %q is not the log's %q", c.Origin, cp.Origin)})
		case c.Size > size:
			r.add(Failure{Kind: KindRollback, Location: h.loc, Detail: fmt.Sprintf("the checkpoint signs %d entries but this earlier one already signed %d: rolled back or replaced by an older checkpoint", size, c.Size)})
		default:
			checks = append(checks, earlier{c, h.loc})
		}
	}
	slices.SortFunc(checks, func(a, b earlier) int { return cmp.Compare(a.cp.Size, b.cp.Size) })

	// Stream the leaves: entries (E) and level-0 tiles (T) side by side.
	// rngT is the tree of the tile hashes (entry hashes where a tile is
	// missing), rngE that of the entry hashes. They are the same tree
	// until the first leaf where they differ, so rngE is only forked off
	// rngT there: one tree to hash in the common case.
	rngT := rangeFactory.NewEmptyRange(0)
	var rngE *compact.Range
	rootsE := map[uint64][32]byte{}
	rootsT := map[uint64][32]byte{}
	ci := 0
	record := func(at uint64) {
		for ; ci < len(checks) && checks[ci].cp.Size == at; ci++ {
			rootsT[at] = rootOf(rngT)
			rootsE[at] = rootsT[at]
			if rngE != nil {
				rootsE[at] = rootOf(rngE)
			}
		}
	}
	record(0)

	// Higher tile levels are checked against the tree built from T.
	up := newUpperTiles(src, size, r)
	visitT := func(id compact.NodeID, h []byte) {
		if id.Level > 0 && id.Level%8 == 0 {
			up.check(id, h)
		}
	}

	var mism []uint64 // leaf indexes where E ≠ T or one is missing
	mismSlot := map[uint64]leafSlot{}
	spill := map[uint64][][32]byte{} // bundle → hashes of its entries past the bundle's width
	lastPresent := int64(-1)         // last index with an entry
	bundles := (size + TileWidth - 1) / TileWidth
	work := startHashers(ctx, src, size, bundles)
	for n := uint64(0); n < bundles; n++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b := <-work[n%uint64(len(work))]
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if b.err != nil {
			return nil, b.err
		}
		base := n * TileWidth
		width := int(min(TileWidth, size-base))
		for _, f := range b.failures {
			r.add(f)
		}
		// Level-0 hash tile (read by the worker).
		t, tloc, tfound := b.tile, b.tileLoc, b.tileFound
		if !tfound {
			r.add(Failure{Kind: KindMissingTile, Location: tloc, Detail: fmt.Sprintf("hash tile 0/%d (%d hashes) is missing", n, width)})
		}
		for j := 0; j < width; j++ {
			i := base + uint64(j)
			var s leafSlot
			if j < len(b.hashes) && b.has[j] {
				s.e, s.hasE = b.hashes[j], true
				lastPresent = int64(i)
			}
			if tfound {
				copy(s.t[:], t[j*32:])
				s.hasT = true
			}
			s.bundleGone = !b.found
			he, ht := s.e, s.t
			if !s.hasE {
				he = s.t
			}
			if !s.hasT {
				ht = s.e
			}
			if rngE == nil && he != ht {
				rngE = cloneRange(rngT)
			}
			// (With neither entry nor hash, he and ht are zero: the tree
			// cannot be rebuilt, and the root check fails.)
			if rngE != nil {
				_ = rngE.Append(he[:], nil)
			}
			_ = rngT.Append(ht[:], visitT)
			if !s.hasE || !s.hasT || s.e != s.t {
				if len(mism) < 4*maxFailures {
					mism = append(mism, i)
					mismSlot[i] = s
				}
			}
			record(i + 1)
		}
		if len(b.hashes) > width {
			if len(spill) < maxFailures {
				spill[n] = b.hashes[width:]
			}
			r.add(Failure{Kind: KindExtraEntry, Index: idx(base + uint64(width)), Location: b.loc,
				Detail: fmt.Sprintf("entry bundle holds %d entries, the checkpoint covers %d of them", len(b.hashes), width)})
		}
		r.Entries += uint64(b.present)
		if progress != nil {
			progress(base+uint64(width), size)
		}
	}

	rootT := rootOf(rngT)
	rootE := rootT
	if rngE != nil {
		rootE = rootOf(rngE)
	}
	tilesOK, entriesOK := rootT == cp.Hash, rootE == cp.Hash
	if !tilesOK && !entriesOK {
		r.add(Failure{Kind: KindRootMismatch, Location: loc, Detail: fmt.Sprintf("neither the entries (root %x…) nor the hash tiles (root %x…) hash to the signed root %x…", rootE[:6], rootT[:6], cp.Hash[:6])})
	}
	if entriesOK && !tilesOK {
		reported := map[uint64]bool{}
		for _, i := range mism {
			if s := mismSlot[i]; s.hasE && s.hasT && !reported[i/TileWidth] {
				reported[i/TileWidth] = true
				r.add(Failure{Kind: KindTileMismatch, Index: idx(i), Location: locTile(src, i/TileWidth, size),
					Detail: "hash tile disagrees with the entries, which match the signed root"})
			}
		}
	} else {
		classifyLeaves(r, mism, mismSlot, spill, lastPresent, size, src)
	}

	// Earlier checkpoints against the tree at their sizes.
	roots := rootsT
	if entriesOK && !tilesOK {
		roots = rootsE
	}
	for _, c := range checks {
		if got := roots[c.cp.Size]; got != c.cp.Hash {
			r.add(Failure{Kind: KindInconsistent, Location: c.loc,
				Detail: fmt.Sprintf("signed root of size %d is %x…, the log's tree at that size is %x…: the log forked or was rewritten", c.cp.Size, c.cp.Hash[:6], got[:6])})
		}
	}

	// Entries beyond the checkpoint.
	extra, err := src.beyond(size)
	if err != nil {
		return nil, err
	}
	for _, e := range extra {
		r.add(Failure{Kind: KindExtraEntry, Location: e, Detail: "entries beyond the signed tree size: no checkpoint covers them"})
	}
	return r, nil
}

// classifyLeaves names the leaves where the entry and the committed hash
// disagree, by comparing, within each stretch of such leaves (a bundle of
// the export; the leaves up to a hole in a bbolt file), the entries present
// with those committed:
//
//   - a committed entry found nowhere is missing (a hole, or the first of
//     entries moved up by one) — or modified, where an entry that was never
//     committed took its place;
//   - an entry never committed, where the committed one moved on, was
//     inserted (extra);
//   - an entry committed at another index is reordered, unless the missing
//     and inserted entries before it in the stretch explain the move (after
//     a deleted entry the rest move up, after an inserted one down).
//
// So a deletion is one missing entry, an adjacent swap two reordered ones.
// Only hashes of the mismatched leaves are compared (at most 4·maxFailures):
// an entry replaced by a copy of one that is still in place is a
// modification.
func classifyLeaves(r *Report, mism []uint64, slots map[uint64]leafSlot, spill map[uint64][][32]byte, lastPresent int64, size uint64, src tlogSource) {
	committedAt := map[[32]byte]uint64{} // committed hash → its index
	present := map[[32]byte]bool{}       // hashes of the entries at the mismatched leaves
	for _, i := range mism {
		s := slots[i]
		if s.hasT {
			committedAt[s.t] = i
		}
		if s.hasE {
			present[s.e] = true
		}
	}
	for _, hs := range spill {
		for _, h := range hs {
			present[h] = true // pushed past its bundle's end by an insertion
		}
	}
	// Truncation: every entry from some index to the end is missing.
	truncAt := uint64(lastPresent + 1)
	if truncAt < size {
		r.add(Failure{Kind: KindTruncated, Index: idx(truncAt), Location: locBundle(src, truncAt/TileWidth, size),
			Detail: fmt.Sprintf("the log ends after %d entries; the checkpoint signs %d", truncAt, size)})
	}
	// Deletions and insertions move the entries after them up to the end
	// of their bundle file (export) or commit (bbolt, where the moved
	// entries end at a hole): the stretch whose counts explain moves.
	_, perBundle := src.(*dirSource)
	reportedGone := map[uint64]bool{} // bundles reported missing
	for len(mism) > 0 && mism[0] < truncAt {
		n := 1
		for n < len(mism) && mism[n] < truncAt && slots[mism[n-1]].hasE && !(perBundle && mism[n]/TileWidth != mism[n-1]/TileWidth) {
			n++
		}
		classifyStretch(r, mism[:n], slots, committedAt, present, reportedGone, size, src)
		mism = mism[n:]
	}
}

// classifyStretch classifies one stretch of classifyLeaves.
func classifyStretch(r *Report, stretch []uint64, slots map[uint64]leafSlot, committedAt map[[32]byte]uint64, present map[[32]byte]bool,
	reportedGone map[uint64]bool, size uint64, src tlogSource) {
	// gone reports whether the entry committed at i is absent: neither
	// present elsewhere nor replaced in place by an entry never committed
	// (a modification, which moves nothing).
	gone := func(s leafSlot) bool {
		if !s.hasT || present[s.t] {
			return false
		}
		_, committed := committedAt[s.e]
		return !s.hasE || committed
	}
	var absent []uint64 // indexes of the committed entries gone, ascending
	for _, i := range stretch {
		if s := slots[i]; !s.bundleGone && gone(s) {
			absent = append(absent, i)
		}
	}
	inserted := 0 // entries inserted so far in the stretch
	for _, i := range stretch {
		s := slots[i]
		if s.bundleGone {
			if n := i / TileWidth; !reportedGone[n] {
				reportedGone[n] = true
				r.add(Failure{Kind: KindMissingTile, Index: idx(n * TileWidth), Location: locBundle(src, n, size),
					Detail: "entry bundle is missing"})
			}
			continue
		}
		if !s.hasT {
			continue // hash tile missing (reported); the entry cannot be checked alone
		}
		loc := locEntry(src, i, size)
		if !s.hasE {
			if gone(s) {
				r.add(Failure{Kind: KindMissingEntry, Index: idx(i), Location: loc, Detail: "entry is missing"})
			}
			continue // else the hole where entries moved up by a deletion end
		}
		j, committed := committedAt[s.e]
		switch {
		case !committed && !present[s.t]:
			r.add(Failure{Kind: KindModifiedEntry, Index: idx(i), Location: loc, Detail: "entry bytes differ from the committed leaf hash"})
			continue
		case !committed:
			inserted++
			r.add(Failure{Kind: KindExtraEntry, Index: idx(i), Location: loc,
				Detail: "an entry was inserted here: the entries after it moved down"})
			continue
		case gone(s):
			r.add(Failure{Kind: KindMissingEntry, Index: idx(i), Location: loc,
				Detail: "entry is missing: the entries after it moved up"})
		}
		// Where the entry committed at j would be after the deletions
		// before it and the insertions before i.
		deleted, _ := slices.BinarySearch(absent, j)
		if want := uint64(int64(i) + int64(deleted) - int64(inserted)); want != j {
			r.add(Failure{Kind: KindReorderedEntry, Index: idx(i), Location: loc,
				Detail: fmt.Sprintf("entry is the one committed at index %d", j)})
		}
	}
}

// locTile and locBundle name level-0 hash tile n and entry bundle n in the
// source's terms.
func locTile(src tlogSource, n, size uint64) string {
	if _, ok := src.(*dirSource); ok {
		return HashTilePath(0, n, int(min(TileWidth, size-n*TileWidth)))
	}
	return fmt.Sprintf("tiles/0/%d", n)
}

func locBundle(src tlogSource, n, size uint64) string {
	if _, ok := src.(*dirSource); ok {
		return EntryBundlePath(n, int(min(TileWidth, size-n*TileWidth)))
	}
	return fmt.Sprintf("entries/%d-%d", n*TileWidth, min(size, (n+1)*TileWidth)-1)
}

func locEntry(src tlogSource, i, size uint64) string {
	if _, ok := src.(*dirSource); ok {
		n := i / TileWidth
		return EntryBundlePath(n, int(min(TileWidth, size-n*TileWidth))) + "#" + strconv.FormatUint(i%TileWidth, 10)
	}
	return "entries/" + strconv.FormatUint(i, 10)
}

// upperTiles checks the hash tiles of levels ≥ 1 against the nodes of the
// tree rebuilt from level 0, one tile per level in memory at a time.
type upperTiles struct {
	src  tlogSource
	size uint64
	r    *Report
	cur  map[uint]*upperTile
}

type upperTile struct {
	n       uint64
	data    []byte
	loc     string
	found   bool
	bad     bool
	checked int
}

func newUpperTiles(src tlogSource, size uint64, r *Report) *upperTiles {
	return &upperTiles{src: src, size: size, r: r, cur: map[uint]*upperTile{}}
}

func (u *upperTiles) check(id compact.NodeID, h []byte) {
	level := id.Level / 8
	n := id.Index / TileWidth
	t := u.cur[level]
	if t == nil || t.n != n {
		count := u.size >> (8 * level)
		width := int(min(TileWidth, count-n*TileWidth))
		data, loc, found, err := u.src.tile(level, n, width)
		if err != nil {
			found = false
		}
		t = &upperTile{n: n, data: data, loc: loc, found: found}
		u.cur[level] = t
		if !found {
			u.r.add(Failure{Kind: KindMissingTile, Location: loc, Detail: fmt.Sprintf("hash tile %d/%d (%d hashes) is missing", level, n, width)})
		}
	}
	t.checked++
	if !t.found || t.bad {
		return
	}
	off := int(id.Index%TileWidth) * 32
	if off+32 > len(t.data) || !bytes.Equal(t.data[off:off+32], h) {
		t.bad = true
		u.r.add(Failure{Kind: KindTileMismatch, Location: t.loc,
			Detail: fmt.Sprintf("hash %d of tile %d/%d disagrees with the tree built from level 0 (entries %d–%d)",
				id.Index%TileWidth, level, n, id.Index<<id.Level, ((id.Index+1)<<id.Level)-1)})
	}
}

// Parallel hashing of entry bundles: workers read, decode and hash bundles
// ahead of the main loop, which folds the hashes into the tree in order.

type hashedBundle struct {
	tile      []byte // level-0 hash tile
	tileLoc   string
	tileFound bool
	hashes    [][32]byte
	has       []bool
	present   int
	found     bool
	loc       string
	failures  []Failure
	err       error
}

func startHashers(ctx context.Context, src tlogSource, size, bundles uint64) []chan hashedBundle {
	workers := max(1, min(runtime.GOMAXPROCS(0), 8))
	chans := make([]chan hashedBundle, workers)
	for w := range chans {
		chans[w] = make(chan hashedBundle, 4)
	}
	// A bbolt transaction is not safe for concurrent use; files are.
	var mu sync.Mutex
	_, concurrent := src.(*dirSource)
	for w := 0; w < workers; w++ {
		go func(w int) {
			defer close(chans[w])
			var buf []byte // reused: hashing keeps no reference to it
			for n := uint64(w); n < bundles; n += uint64(workers) {
				if ctx.Err() != nil {
					return
				}
				width := int(min(TileWidth, size-n*TileWidth))
				if !concurrent {
					mu.Lock()
				}
				recs, loc, found, err := src.bundle(n, width, &buf)
				var t []byte
				var tloc string
				var tfound bool
				if err == nil {
					t, tloc, tfound, err = src.tile(0, n, width)
				}
				if !concurrent {
					mu.Unlock()
				}
				hb := hashedBundle{found: found, loc: loc, err: err, tile: t, tileLoc: tloc, tileFound: tfound}
				var scratch Entry
				if err == nil {
					hb.hashes = make([][32]byte, len(recs))
					hb.has = make([]bool, len(recs))
					for j, rec := range recs {
						if rec == nil {
							continue
						}
						hb.hashes[j], hb.has[j] = LeafHash(rec), true
						hb.present++
						if derr := validateEntry(rec, &scratch); derr != nil {
							hb.failures = append(hb.failures, Failure{Kind: KindMalformedEntry, Index: idx(n*TileWidth + uint64(j)), Location: loc, Detail: derr.Error()})
						}
					}
					if !found {
						hb.loc = loc
					}
				}
				select {
				case chans[w] <- hb:
				case <-ctx.Done():
					return
				}
			}
		}(w)
	}
	return chans
}

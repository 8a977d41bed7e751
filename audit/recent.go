package audit

import "sync"

// recentChanges keeps the payloads of the changes this copy stored last,
// in revision order, so that a store projecting the log (Changes, right
// after ChangesNotify) takes them from memory instead of reading each
// back and checking it against its entry again: the copy checked each
// payload against its entry when it stored it (applyCommit), or made it
// itself. Older revisions, and any after a recovery, come from the file,
// checked.
type recentChanges struct {
	mu    sync.Mutex
	items []recentChange // every change stored from items[0].rev on
	bytes int
}

type recentChange struct {
	rev, index uint64
	payload    []byte
}

// Bounds of the changes kept in memory.
const (
	recentMaxItems = 4096
	recentMaxBytes = 16 << 20
)

// add keeps the changes of props (stored, in order); snapshots are not
// Changes' and are not kept.
func (r *recentChanges) add(props []proposed) {
	if len(props) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range props {
		if p.snapshot {
			continue
		}
		if n := len(r.items); n > 0 && r.items[n-1].rev >= p.rev {
			r.items, r.bytes = nil, 0 // not in order: start again from here
		}
		r.items = append(r.items, recentChange{rev: p.rev, index: p.first, payload: p.payload})
		r.bytes += len(p.payload)
	}
	drop := 0
	for len(r.items)-drop > recentMaxItems || r.bytes > recentMaxBytes && drop < len(r.items)-1 {
		r.bytes -= len(r.items[drop].payload)
		drop++
	}
	if drop > 0 {
		r.items = append(r.items[:0:0], r.items[drop:]...)
	}
}

// reset forgets every change kept (the file was reopened).
func (r *recentChanges) reset() {
	r.mu.Lock()
	r.items, r.bytes = nil, 0
	r.mu.Unlock()
}

// after returns the kept changes after revision from, and whether they
// are all the changes after it this copy stored (from is not before the
// first kept).
func (r *recentChanges) after(from uint64) ([]recentChange, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.items) == 0 || from+1 < r.items[0].rev {
		return nil, false
	}
	i := len(r.items)
	for i > 0 && r.items[i-1].rev > from {
		i--
	}
	return r.items[i:], true
}

// stored notes that props were stored in this copy: kept for Changes, and
// signalled (ChangesNotify).
func (l *Log) stored(props []proposed) {
	l.recent.add(props)
	l.noteChanges(len(props))
}

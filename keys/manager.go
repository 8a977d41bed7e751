package keys

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// RotationEvent describes a rotation for the audit hook. It carries
// versions and fingerprints, never keys.
type RotationEvent struct {
	Kind        string // "access_root", "data_key", KindDataKeyErase or KindDataKeyReencrypt
	Name        string // subsystem NQN, or namespace "<NQN>/<NSID>"
	Version     uint64 // the new version; 0 for a data key before Transit picks it
	Fingerprint string // of the new root; "" for data keys
	Reason      string // "scheduled", "on demand: …", "revocation: …"
	Time        time.Time
	// Outcome is "" when the hook is called before the change (its error
	// then vetoes the change: nothing rotates unrecorded), "applied" after
	// a data key rotation (whose new version only Transit knows), or
	// "not applied: …" after a change that failed.
	Outcome string
}

// Options configure a Manager. Backend is required; zero durations take
// the documented defaults.
type Options struct {
	Backend Backend
	// Grace is how long a superseded root version stays usable (renewals
	// of grants issued under it). Default 1h.
	Grace time.Duration
	// RotationPeriod is the age at which Run rotates a root. Default 720h
	// (30 days); negative disables scheduled rotation.
	RotationPeriod time.Duration
	// DataKeyRotationPeriod is the age of a namespace's KEK at which Run
	// rotates it (and rewraps the data key). Default 2160h (90 days);
	// negative disables it. Run looks at the namespaces given to
	// TrackDataKeys and those whose data keys this manager used.
	DataKeyRotationPeriod time.Duration
	// RefreshInterval is how often Run re-reads cached roots. Default 30s.
	RefreshInterval time.Duration
	// MaxStaleness bounds the age of the cached roots credentials are
	// derived from; past it, issuance fails with ErrUnavailable. Default 5m.
	MaxStaleness time.Duration
	// OnRotate is the audit hook: called before every rotation this
	// manager makes, with the new version and fingerprint (an error vetoes
	// the rotation), and again if the rotation then fails, or, for data
	// keys, when the new version is known (see RotationEvent.Outcome).
	OnRotate func(context.Context, RotationEvent) error
	// OnRotated hears of every access root rotation this manager made,
	// once the backend holds the new root (replicas note it in their
	// shared store, so that every replica drops the old one at once). An
	// error is logged: the rotation is made, and the others read it at
	// their next refresh.
	OnRotated func(context.Context, RotationEvent) error
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// Manager serves the key hierarchy of one gateway from a Backend, with the
// current roots cached in memory. Safe for concurrent use.
type Manager struct {
	b    Backend
	opts Options
	log  *slog.Logger

	mu       sync.RWMutex
	cache    map[string]*cached  // subsystem NQN → roots
	dataKeys map[string]struct{} // namespaces whose KEKs Run rotates on schedule
	// kept holds the data keys NamespaceKeys unwrapped, per namespace;
	// each use checks them against the backend's record first.
	kept map[string]*keptKeys
	// epochs counts each scope's Expire calls: a read that began before
	// one is not kept.
	epochs map[string]uint64

	backendReads atomic.Uint64 // round trips to the backend, for metrics and benchmarks

	memoMu sync.Mutex
	memo   map[deriveKey]Credentials // derivations already made (see derive)
}

// deriveKey names one derivation: the root (subsystem, version and its
// creation time, so a root re-created under a reused version is a different
// root) and what was derived from it for whom.
type deriveKey struct {
	sub, host string
	version   uint64
	created   int64
	p         CredentialParams
}

// maxMemo bounds the derivation memo; past it the memo starts over.
const maxMemo = 1 << 17

// derive is Derive, remembered: a target's desired state re-derives every
// host's credentials on each programming run (O(hosts) HMACs per connect
// under a storm). The memo holds what the roots it derives from already
// give away, in the same process; every check of the caller (freshness,
// grace) still runs before it is consulted.
func (m *Manager) derive(r Root, hostNQN, subNQN string, p CredentialParams) (Credentials, error) {
	k := deriveKey{sub: subNQN, host: hostNQN, version: r.Version, created: r.Created.UnixNano(), p: p}
	m.memoMu.Lock()
	c, ok := m.memo[k]
	m.memoMu.Unlock()
	if ok {
		return c, nil
	}
	c, err := Derive(r, hostNQN, subNQN, p)
	if err != nil {
		return c, err
	}
	m.memoMu.Lock()
	if m.memo == nil || len(m.memo) >= maxMemo {
		m.memo = map[deriveKey]Credentials{}
	}
	m.memo[k] = c
	m.memoMu.Unlock()
	return c, nil
}

// cached is a subsystem's roots as last read from the backend.
type cached struct {
	roots   []Root // oldest first; the last is current
	fetched time.Time
}

// NewManager returns a Manager over opts.Backend.
func NewManager(opts Options) (*Manager, error) {
	if opts.Backend == nil {
		return nil, errors.New("keys: Backend is required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&opts.Grace, time.Hour)
	def(&opts.RotationPeriod, 30*24*time.Hour)
	def(&opts.DataKeyRotationPeriod, 90*24*time.Hour)
	def(&opts.RefreshInterval, 30*time.Second)
	def(&opts.MaxStaleness, 5*time.Minute)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{b: opts.Backend, opts: opts, log: log, cache: map[string]*cached{}, dataKeys: map[string]struct{}{},
		kept: map[string]*keptKeys{}, epochs: map[string]uint64{}}, nil
}

// BackendReads is the number of round trips to the backend so far.
func (m *Manager) BackendReads() uint64 { return m.backendReads.Load() }

// Credentials derives hostNQN's credentials for subsystem subNQN from the
// current root, from the cache: it reaches the backend only the first time
// a subsystem is used (Warm avoids even that). It fails with ErrUnavailable
// if the cached roots are older than MaxStaleness.
func (m *Manager) Credentials(ctx context.Context, hostNQN, subNQN string, p CredentialParams) (Credentials, error) {
	r, err := m.current(ctx, subNQN)
	if err != nil {
		return Credentials{}, err
	}
	return m.derive(r, hostNQN, subNQN, p)
}

// CredentialsAt derives credentials from root version v, which must be the
// current one or superseded less than Grace ago (else ErrExpired).
func (m *Manager) CredentialsAt(ctx context.Context, hostNQN, subNQN string, v uint64, p CredentialParams) (Credentials, error) {
	r, err := m.rootAt(ctx, subNQN, v)
	if err != nil {
		return Credentials{}, err
	}
	return m.derive(r, hostNQN, subNQN, p)
}

// Usable reports, as an error, whether root version v of subNQN may still
// be used: nil, or ErrExpired once it is past its grace (or gone).
func (m *Manager) Usable(ctx context.Context, subNQN string, v uint64) error {
	_, err := m.rootAt(ctx, subNQN, v)
	return err
}

// rootAt is root version v of subNQN if a host may still use it.
func (m *Manager) rootAt(ctx context.Context, subNQN string, v uint64) (Root, error) {
	c, err := m.fresh(ctx, subNQN)
	if err != nil {
		return Root{}, err
	}
	if v > currentVersion(c.roots) {
		// Another gateway rotated since our last refresh.
		if c, err = m.load(ctx, subNQN); err != nil {
			return Root{}, err
		}
	}
	now := m.opts.Now()
	for _, r := range c.roots {
		if r.Version != v {
			continue
		}
		if !r.Superseded.IsZero() && !now.Before(r.Superseded.Add(m.opts.Grace)) {
			return Root{}, fmt.Errorf("%w: %s root v%d was superseded at %s (grace %s)", ErrExpired, subNQN, v,
				r.Superseded.UTC().Format(time.RFC3339), m.opts.Grace)
		}
		return r, nil
	}
	return Root{}, fmt.Errorf("%w: %s has no root v%d", ErrExpired, subNQN, v)
}

// current returns the current root of subNQN, creating version 1 if the
// subsystem has none.
func (m *Manager) current(ctx context.Context, subNQN string) (Root, error) {
	c, err := m.fresh(ctx, subNQN)
	if err != nil {
		return Root{}, err
	}
	if len(c.roots) > 0 {
		return c.roots[len(c.roots)-1], nil
	}
	if _, err := m.rotate(ctx, subNQN, 0, "first use"); err != nil && !errors.Is(err, ErrConflict) {
		return Root{}, err
	}
	if c, err = m.load(ctx, subNQN); err != nil {
		return Root{}, err
	}
	if len(c.roots) == 0 {
		return Root{}, fmt.Errorf("%w: %s has no root after creating one", ErrUnavailable, subNQN)
	}
	return c.roots[len(c.roots)-1], nil
}

// fresh returns the cached roots of subNQN, loading them on first use, and
// refuses roots older than MaxStaleness.
func (m *Manager) fresh(ctx context.Context, subNQN string) (*cached, error) {
	if subNQN == "" {
		return nil, fmt.Errorf("%w: subsystem NQN is required", ErrInvalid)
	}
	m.mu.RLock()
	c := m.cache[subNQN]
	m.mu.RUnlock()
	if c == nil {
		return m.load(ctx, subNQN)
	}
	if age := m.opts.Now().Sub(c.fetched); age > m.opts.MaxStaleness {
		return nil, fmt.Errorf("%w: the roots of %s were last confirmed %s ago (bound %s); no credentials are issued until the key store answers",
			ErrUnavailable, subNQN, age.Round(time.Second), m.opts.MaxStaleness)
	}
	return c, nil
}

// load reads subNQN's roots from the backend into the cache.
func (m *Manager) load(ctx context.Context, subNQN string) (*cached, error) {
	m.mu.RLock()
	epoch := m.epochs[subNQN]
	m.mu.RUnlock()
	m.backendReads.Add(1)
	roots, err := m.b.Roots(ctx, subNQN)
	if err != nil {
		return nil, err
	}
	return m.storeRead(subNQN, roots, epoch), nil
}

// store caches roots written just now, unless the cache already holds a
// newer current version.
func (m *Manager) store(subNQN string, roots []Root) *cached {
	m.mu.RLock()
	epoch := m.epochs[subNQN]
	m.mu.RUnlock()
	return m.storeRead(subNQN, roots, epoch)
}

// storeRead caches roots read since Expire's epoch of subNQN was epoch,
// unless the cache already holds a newer current version: a slow read that
// started before a rotation must not roll the cache back to the superseded
// root. A read that began before an Expire is served to its caller but
// not kept: the next use reads again.
func (m *Manager) storeRead(subNQN string, roots []Root, epoch uint64) *cached {
	c := &cached{roots: roots, fetched: m.opts.Now()}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epochs[subNQN] != epoch {
		return c
	}
	if old := m.cache[subNQN]; old != nil && currentVersion(old.roots) > currentVersion(roots) {
		return old
	}
	m.cache[subNQN] = c
	return c
}

// Expire drops the kept roots of scopes: their next use reads them from
// the backend. A replica calls it when it applies another replica's
// revocation, which rotated those roots before it was stored, so that it
// never grants again under the root the revocation retired.
func (m *Manager) Expire(scopes ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range scopes {
		delete(m.cache, s)
		m.epochs[s]++
	}
}

func currentVersion(roots []Root) uint64 {
	if len(roots) == 0 {
		return 0
	}
	return roots[len(roots)-1].Version
}

// Warm loads the roots of the given subsystems (and of every subsystem the
// backend knows) into the cache, so that no connect waits for them.
func (m *Manager) Warm(ctx context.Context, subsystems ...string) error {
	known, err := m.b.Subsystems(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range slices.Compact(slices.Sorted(slices.Values(append(known, subsystems...)))) {
		if _, err := m.load(ctx, s); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
		}
	}
	return errors.Join(errs...)
}

// Rotate makes a new root version of subNQN now. If another gateway
// rotated it concurrently, Rotate makes none and returns that version with
// an error wrapping ErrConflict: a root is never rotated twice for one
// reason.
func (m *Manager) Rotate(ctx context.Context, subNQN, reason string) (Root, error) {
	m.backendReads.Add(1)
	roots, err := m.b.Roots(ctx, subNQN)
	if err != nil {
		return Root{}, err
	}
	var prev uint64
	if len(roots) > 0 {
		prev = roots[len(roots)-1].Version
	}
	return m.rotate(ctx, subNQN, prev, reason)
}

func (m *Manager) rotate(ctx context.Context, subNQN string, prev uint64, reason string) (Root, error) {
	secret := make([]byte, RootSize)
	if _, err := rand.Read(secret); err != nil {
		return Root{}, err
	}
	now := m.opts.Now()
	next := Root{Version: prev + 1, Secret: secret, Created: now}
	ev := RotationEvent{Kind: "access_root", Name: subNQN, Version: next.Version, Fingerprint: RootFingerprint(next), Reason: reason, Time: now}
	if err := m.record(ctx, ev); err != nil {
		return Root{}, fmt.Errorf("keys: rotation of %s not made: it could not be recorded: %w", subNQN, err)
	}
	m.backendReads.Add(1)
	roots, err := m.b.AddRoot(ctx, subNQN, prev, secret, now, now.Add(-m.opts.Grace))
	if err != nil {
		ev.Outcome = "not applied: " + outcome(err)
		if rerr := m.record(ctx, ev); rerr != nil {
			m.log.Error("keys: failed rotation not recorded", "subsystem", subNQN, "err", rerr)
		}
	}
	if errors.Is(err, ErrConflict) {
		// Someone else rotated: take their version, make none.
		if c, lerr := m.load(ctx, subNQN); lerr == nil && len(c.roots) > 0 {
			return c.roots[len(c.roots)-1], err
		}
		return Root{}, err
	}
	if err != nil {
		return Root{}, err
	}
	m.store(subNQN, roots)
	cur := roots[len(roots)-1]
	m.log.Info("keys: access root rotated", "subsystem", subNQN, "version", cur.Version, "reason", reason)
	if m.opts.OnRotated != nil {
		ev.Outcome, ev.Version, ev.Fingerprint = "applied", cur.Version, RootFingerprint(cur)
		if err := m.opts.OnRotated(ctx, ev); err != nil {
			m.log.Error("keys: access root rotated, not yet noted for the other replicas; they read it at their next refresh", "subsystem", subNQN, "err", err)
		}
	}
	return cur, nil
}

func (m *Manager) record(ctx context.Context, ev RotationEvent) error {
	if m.opts.OnRotate == nil {
		return nil
	}
	return m.opts.OnRotate(ctx, ev)
}

// outcome names a failure for the audit log without its details.
func outcome(err error) string {
	switch {
	case errors.Is(err, ErrConflict):
		return "rotated concurrently by another gateway"
	case errors.Is(err, ErrUnavailable):
		return "key store unavailable"
	case errors.Is(err, ErrNotFound):
		return "no such key"
	}
	return "key store error"
}

// Revoked is the hook the connect flow calls when access ends (a job
// finished, a grant revoked): the subsystem's root rotates, so that
// credentials derived from the old one stop working after the grace.
func (m *Manager) Revoked(ctx context.Context, subNQN, why string) error {
	_, err := m.Rotate(ctx, subNQN, "revocation: "+why)
	if errors.Is(err, ErrConflict) {
		return nil // rotated concurrently: the old root is superseded either way
	}
	return err
}

// Run refreshes the cached roots every RefreshInterval and rotates those
// older than RotationPeriod, until ctx ends. A backend outage is logged and
// retried; issuance fails closed once the cache is too stale.
func (m *Manager) Run(ctx context.Context, tick <-chan time.Time) error {
	if tick == nil {
		t := time.NewTicker(m.opts.RefreshInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			m.Tick(ctx)
		}
	}
}

// TrackDataKeys adds namespaces to the scheduled data-key rotation.
func (m *Manager) TrackDataKeys(namespaces ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range namespaces {
		m.dataKeys[n] = struct{}{}
	}
}

// Tick is one round of Run: refresh every cached subsystem, rotate the
// roots older than RotationPeriod and the tracked KEKs older than
// DataKeyRotationPeriod.
func (m *Manager) Tick(ctx context.Context) {
	m.mu.RLock()
	subs := make([]string, 0, len(m.cache))
	for s := range m.cache {
		subs = append(subs, s)
	}
	nss := make([]string, 0, len(m.dataKeys))
	for n := range m.dataKeys {
		nss = append(nss, n)
	}
	m.mu.RUnlock()
	defer m.tickDataKeys(ctx, nss)
	slices.Sort(subs)
	now := m.opts.Now()
	for _, s := range subs {
		c, err := m.load(ctx, s)
		if err != nil {
			m.log.Warn("keys: refresh failed; serving cached roots until the staleness bound", "subsystem", s, "err", err)
			continue
		}
		if m.opts.RotationPeriod < 0 || len(c.roots) == 0 {
			continue
		}
		cur := c.roots[len(c.roots)-1]
		if now.Sub(cur.Created) >= m.opts.RotationPeriod {
			if _, err := m.rotate(ctx, s, cur.Version, "scheduled"); err != nil && !errors.Is(err, ErrConflict) {
				m.log.Warn("keys: scheduled rotation failed", "subsystem", s, "err", err)
			}
		}
	}
}

func (m *Manager) tickDataKeys(ctx context.Context, nss []string) {
	if m.opts.DataKeyRotationPeriod < 0 {
		return
	}
	slices.Sort(nss)
	now := m.opts.Now()
	for _, n := range nss {
		vs, err := m.b.KEKVersions(ctx, n)
		if err != nil {
			m.log.Warn("keys: data key check failed", "namespace", n, "err", err)
			continue
		}
		if len(vs) == 0 || now.Sub(vs[len(vs)-1].Created) < m.opts.DataKeyRotationPeriod {
			continue
		}
		if _, err := m.RotateDataKey(ctx, n, "scheduled"); err != nil {
			m.log.Warn("keys: scheduled data key rotation failed", "namespace", n, "err", err)
		}
	}
}

// RootStatus describes a subsystem's root versions, never their secrets.
type RootStatus struct {
	Subsystem    string
	Current      uint64
	NextRotation time.Time // zero if scheduled rotation is off
	Versions     []VersionStatus
}

// VersionStatus is one root version's state.
type VersionStatus struct {
	Version     uint64
	Created     time.Time
	Superseded  time.Time // zero for current
	ValidUntil  time.Time // zero for current
	Fingerprint string
}

// Status reads subNQN's roots from the backend (not the cache: it is for
// operators) and describes them, newest first.
func (m *Manager) Status(ctx context.Context, subNQN string) (RootStatus, error) {
	c, err := m.load(ctx, subNQN)
	if err != nil {
		return RootStatus{}, err
	}
	st := RootStatus{Subsystem: subNQN}
	for i := len(c.roots) - 1; i >= 0; i-- {
		r := c.roots[i]
		v := VersionStatus{Version: r.Version, Created: r.Created, Superseded: r.Superseded, Fingerprint: RootFingerprint(r)}
		if !r.Superseded.IsZero() {
			v.ValidUntil = r.Superseded.Add(m.opts.Grace)
		}
		st.Versions = append(st.Versions, v)
	}
	if len(c.roots) > 0 {
		cur := c.roots[len(c.roots)-1]
		st.Current = cur.Version
		if m.opts.RotationPeriod > 0 {
			st.NextRotation = cur.Created.Add(m.opts.RotationPeriod)
		}
	}
	return st, nil
}

// Subsystems lists the subsystems that have roots.
func (m *Manager) Subsystems(ctx context.Context) ([]string, error) { return m.b.Subsystems(ctx) }

// keptKeys is what this manager unwrapped of one namespace's data keys:
// kept so that the targets' periodic whole states cost no Transit call
// each, but only ever served after the backend confirmed, in the same
// call, that they are still the namespace's (see NamespaceKeys).
type keptKeys struct {
	owner     string
	cur, next keptKey // next.key is nil when no re-encryption is under way
	confirmed time.Time
}

// keptKey is one unwrapped data key and the wrapping it came from.
type keptKey struct {
	key     []byte
	wrapped Wrapped
}

// same reports whether k was unwrapped from w: the same generation and
// ciphertext (a KEK rotation rewraps the same key: it is unwrapped again
// once, which costs one Transit call per KEK rotation).
func (k keptKey) same(w Wrapped) bool {
	return k.key != nil && k.wrapped.Gen() == w.Gen() && k.wrapped.Ciphertext == w.Ciphertext
}

// NamespaceKeys is what a target needs to open a namespace it encrypts at
// rest: its data key and, while a re-encryption is under way, the next
// one. The keys are the caller's copies.
type NamespaceKeys struct {
	Key     []byte
	Wrapped Wrapped
	// Next is nil when no re-encryption is under way.
	Next        []byte
	NextWrapped Wrapped
}

// NamespaceKeys returns the data keys of the namespace record owner (its
// incarnation: "" for a record from before incarnations), making its data
// key on first use, and tracks the namespace for scheduled rotation.
//
// Every call reads the backend's record first: another gateway replica may
// have committed a re-encryption, begun one, or crypto-erased the key, and
// a kept key is served only while it is still the record's. A key stored
// for another record of the same name (a namespace removed without erase
// and added again) is refused with ErrForeign, never inherited. Only when
// the backend cannot be reached are the keys confirmed last served, for at
// most MaxStaleness, as credentials are.
func (m *Manager) NamespaceKeys(ctx context.Context, namespace, owner string) (NamespaceKeys, error) {
	m.TrackDataKeys(namespace)
	for attempt := 1; ; attempt++ {
		k, err := m.namespaceKeys(ctx, namespace, owner)
		// A commit between the record's read and the unwrap destroyed the
		// generation read: the record has moved on; read it again.
		if errors.Is(err, errGenerationGone) && attempt < 3 {
			continue
		}
		return k, err
	}
}

// errGenerationGone: the KEK of a generation just read from the record is
// gone (a commit or an erase came between).
var errGenerationGone = errors.New("keys: the data key generation read is gone")

func (m *Manager) namespaceKeys(ctx context.Context, namespace, owner string) (NamespaceKeys, error) {
	asked := m.opts.Now()
	rec, err := m.keyRecord(ctx, namespace, owner)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return m.keptFor(namespace, owner, asked, err)
		}
		m.forget(namespace)
		return NamespaceKeys{}, err
	}
	if rec.Owner != owner {
		m.forget(namespace)
		return NamespaceKeys{}, foreign(namespace, rec.Owner, owner)
	}
	// What is kept and still the record's is taken as copies, under the
	// lock: forget zeroes the kept bytes in place, and an entry never
	// shares its bytes with another.
	nk := keptKeys{owner: owner, confirmed: asked}
	m.mu.RLock()
	if k := m.kept[namespace]; k != nil && k.owner == owner {
		if k.cur.same(rec.Wrapped) {
			nk.cur.key = bytes.Clone(k.cur.key)
		}
		if rec.Next != nil && k.next.same(*rec.Next) {
			nk.next.key = bytes.Clone(k.next.key)
		}
	}
	m.mu.RUnlock()
	if nk.cur.key == nil {
		if nk.cur.key, err = m.unwrap(ctx, namespace, rec.Wrapped); err != nil {
			return NamespaceKeys{}, gone(err)
		}
	}
	nk.cur.wrapped = rec.Wrapped
	if rec.Next != nil {
		if nk.next.key == nil {
			if nk.next.key, err = m.unwrap(ctx, namespace, *rec.Next); err != nil {
				return NamespaceKeys{}, gone(err)
			}
		}
		nk.next.wrapped = *rec.Next
	}
	out := nk.copy() // before nk is kept: from then on forget may zero it
	m.mu.Lock()
	// A call that read the record earlier must not replace what a later
	// one confirmed.
	if old := m.kept[namespace]; old == nil || !old.confirmed.After(asked) {
		m.kept[namespace] = &nk
	}
	m.mu.Unlock()
	return out, nil
}

// copy is the caller's copy of k's keys.
func (k *keptKeys) copy() NamespaceKeys {
	out := NamespaceKeys{Key: bytes.Clone(k.cur.key), Wrapped: k.cur.wrapped}
	if k.next.key != nil {
		out.Next, out.NextWrapped = bytes.Clone(k.next.key), k.next.wrapped
	}
	return out
}

// keptFor serves the kept keys of namespace while the backend is away
// (err), if they belong to owner and were confirmed less than
// MaxStaleness before asked.
func (m *Manager) keptFor(namespace, owner string, asked time.Time, err error) (NamespaceKeys, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	k := m.kept[namespace]
	if k == nil || k.owner != owner || asked.Sub(k.confirmed) > m.opts.MaxStaleness {
		return NamespaceKeys{}, err
	}
	return k.copy(), nil
}

// record reads namespace's data key record, making the data key for owner
// if there is none.
func (m *Manager) keyRecord(ctx context.Context, namespace, owner string) (DataKeyRecord, error) {
	m.backendReads.Add(1)
	rec, err := m.b.DataKey(ctx, namespace)
	if !errors.Is(err, ErrNotFound) {
		return rec, err
	}
	m.backendReads.Add(1)
	w, err := m.b.CreateDataKey(ctx, namespace, owner)
	if errors.Is(err, ErrConflict) {
		m.backendReads.Add(1)
		return m.b.DataKey(ctx, namespace)
	}
	return DataKeyRecord{Wrapped: w, Owner: owner}, err
}

// gone marks an unwrap that found no KEK: the generation read is gone.
func gone(err error) error {
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%w: %w", errGenerationGone, err)
	}
	return err
}

func (m *Manager) unwrap(ctx context.Context, namespace string, w Wrapped) ([]byte, error) {
	m.backendReads.Add(1)
	return m.b.Unwrap(ctx, namespace, w)
}

// forget drops and zeroes the kept keys of namespace.
func (m *Manager) forget(namespace string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k := m.kept[namespace]; k != nil {
		clear(k.cur.key)
		clear(k.next.key)
		delete(m.kept, namespace)
	}
}

// ErrForeign: the data key stored under a namespace's name belongs to
// another namespace record (one removed without erase before this one was
// added under the same subsystem NQN and NSID).
var ErrForeign = errors.New("keys: the data key stored under this name belongs to another namespace record")

func foreign(namespace, stored, owner string) error {
	if stored == "" {
		stored = "a record from before keys named their owner"
	}
	return fmt.Errorf("%w: %s's data key was made for namespace record %s, not %s: the namespace was removed without erase and added again; erase the old key (inventory namespace remove --erase) before this namespace can be encrypted",
		ErrForeign, namespace, stored, cmp.Or(owner, "(none)"))
}

// EnsureDataKey makes the data key of the namespace record owner if it
// has none, without unwrapping it (no plaintext key in the gateway's
// memory), and refuses with ErrForeign a key that belongs to another
// record of the same name.
func (m *Manager) EnsureDataKey(ctx context.Context, namespace, owner string) error {
	m.TrackDataKeys(namespace)
	rec, err := m.keyRecord(ctx, namespace, owner)
	if err == nil && rec.Owner != owner {
		err = foreign(namespace, rec.Owner, owner)
	}
	return err
}

// DataKeyOwner is the namespace record a stored data key belongs to, and
// whether one is stored.
func (m *Manager) DataKeyOwner(ctx context.Context, namespace string) (owner string, found bool, err error) {
	m.backendReads.Add(1)
	rec, err := m.b.DataKey(ctx, namespace)
	if errors.Is(err, ErrNotFound) {
		return "", false, nil
	}
	return rec.Owner, err == nil, err
}

// RotateDataKey rotates the namespace's KEK and rewraps its data key. The
// audit hook hears of it before (and may veto) and after.
func (m *Manager) RotateDataKey(ctx context.Context, namespace, reason string) (Wrapped, error) {
	ev := RotationEvent{Kind: "data_key", Name: namespace, Reason: reason, Time: m.opts.Now()}
	if err := m.record(ctx, ev); err != nil {
		return Wrapped{}, fmt.Errorf("keys: rotation of %s's data key not made: it could not be recorded: %w", namespace, err)
	}
	w, err := m.b.RotateDataKey(ctx, namespace)
	if err != nil {
		ev.Outcome = "not applied: " + outcome(err)
	} else {
		ev.Outcome, ev.Version = "applied", w.KEKVersion
	}
	ev.Time = m.opts.Now()
	if rerr := m.record(ctx, ev); rerr != nil {
		m.log.Error("keys: data key rotation outcome not recorded", "namespace", namespace, "err", rerr)
	}
	return w, err
}

// DestroyDataKey crypto-erases a namespace: its data key and every
// version of its KEK are destroyed in the backend, and the namespace
// leaves the scheduled rotation. The audit hook hears of it before (and
// may veto: nothing is destroyed unrecorded) and after. The caller makes
// sure nothing holds the key any more (the target closed its mapping);
// other replicas' kept copies are never served again, for every use reads
// the backend's record first.
func (m *Manager) DestroyDataKey(ctx context.Context, namespace, reason string) error {
	ev := RotationEvent{Kind: KindDataKeyErase, Name: namespace, Reason: reason, Time: m.opts.Now()}
	if err := m.record(ctx, ev); err != nil {
		return fmt.Errorf("keys: %s's data key not destroyed: it could not be recorded: %w", namespace, err)
	}
	// The kept copy goes first, whatever the backend does: a key being
	// erased is not served again.
	m.forget(namespace)
	err := m.b.DestroyDataKey(ctx, namespace)
	if err != nil {
		ev.Outcome = "not applied: " + outcome(err)
	} else {
		ev.Outcome = "applied"
		m.mu.Lock()
		delete(m.dataKeys, namespace)
		m.mu.Unlock()
	}
	ev.Time = m.opts.Now()
	if rerr := m.record(ctx, ev); rerr != nil {
		m.log.Error("keys: data key destruction outcome not recorded", "namespace", namespace, "err", rerr)
	}
	return err
}

// KindDataKeyErase is the RotationEvent kind of a crypto-erase.
const KindDataKeyErase = "data_key_erase"

// KindDataKeyReencrypt is the RotationEvent kind of a data-key rotation:
// its beginning (Outcome "begun" after) and its commit ("applied").
const KindDataKeyReencrypt = "data_key_reencrypt"

// BeginDataKeyRotation starts a data-key rotation: the namespace's next
// data key is made (or the one under way returned) for the target to
// re-encrypt the namespace to. The audit hook hears of it before (and may
// veto) and after.
func (m *Manager) BeginDataKeyRotation(ctx context.Context, namespace, reason string) (Wrapped, error) {
	ev := RotationEvent{Kind: KindDataKeyReencrypt, Name: namespace, Reason: reason, Time: m.opts.Now()}
	if err := m.record(ctx, ev); err != nil {
		return Wrapped{}, fmt.Errorf("keys: re-encryption of %s not begun: it could not be recorded: %w", namespace, err)
	}
	w, err := m.b.BeginDataKeyRotation(ctx, namespace)
	if err != nil {
		ev.Outcome = "not applied: " + outcome(err)
	} else {
		ev.Outcome, ev.Version = "begun", w.Gen()
	}
	ev.Time = m.opts.Now()
	if rerr := m.record(ctx, ev); rerr != nil {
		m.log.Error("keys: re-encryption start not recorded", "namespace", namespace, "err", rerr)
	}
	return w, err
}

// CommitDataKeyRotation makes generation gen, which the target has
// re-encrypted the namespace to, the namespace's data key; the previous
// one is destroyed. The audit hook hears of it before (and may veto) and
// after.
func (m *Manager) CommitDataKeyRotation(ctx context.Context, namespace string, gen uint64, reason string) (Wrapped, error) {
	ev := RotationEvent{Kind: KindDataKeyReencrypt, Name: namespace, Version: gen, Reason: reason, Time: m.opts.Now()}
	if err := m.record(ctx, ev); err != nil {
		return Wrapped{}, fmt.Errorf("keys: re-encryption of %s not committed: it could not be recorded: %w", namespace, err)
	}
	w, err := m.b.CommitDataKeyRotation(ctx, namespace, gen)
	if err != nil {
		ev.Outcome = "not applied: " + outcome(err)
	} else {
		ev.Outcome = "applied"
		m.forget(namespace) // the old generation's key is destroyed: zero it here too
	}
	ev.Time = m.opts.Now()
	if rerr := m.record(ctx, ev); rerr != nil {
		m.log.Error("keys: re-encryption commit not recorded", "namespace", namespace, "err", rerr)
	}
	return w, err
}

// KEKVersions lists a namespace's key-encryption key versions.
func (m *Manager) KEKVersions(ctx context.Context, namespace string) ([]KEKVersion, error) {
	return m.b.KEKVersions(ctx, namespace)
}

// DataKeyGeneration reads, without unwrapping anything, the generation of
// the data key of the namespace record owner and that of a re-encryption
// under way (0: none; both 0 without a data key). A key of another record
// of the same name is ErrForeign: it is not this namespace's.
func (m *Manager) DataKeyGeneration(ctx context.Context, namespace, owner string) (current, next uint64, err error) {
	m.backendReads.Add(1)
	rec, err := m.b.DataKey(ctx, namespace)
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, 0, nil
	case err != nil:
		return 0, 0, err
	case rec.Owner != owner:
		return 0, 0, foreign(namespace, rec.Owner, owner)
	case rec.Next != nil:
		return rec.Gen(), rec.Next.Gen(), nil
	}
	return rec.Gen(), 0, nil
}

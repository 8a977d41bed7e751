package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
)

// GrantFilter narrows ListGrants; empty fields match everything.
type GrantFilter struct {
	JobID string
	Node  string
	State string
	// RemovalPending: only ended grants whose removal from their target
	// is not acknowledged yet.
	RemovalPending bool
}

type grantRecord struct {
	V             int       `json:"v"`
	ID            string    `json:"id"`
	JobID         string    `json:"job_id"`
	Tenant        string    `json:"tenant"`
	Node          string    `json:"node"`
	HostNQN       string    `json:"host_nqn"`
	SubsystemNQN  string    `json:"subsystem_nqn"`
	KeyVersion    uint64    `json:"key_version"`
	KeyScope      string    `json:"key_scope,omitempty"`
	IssuedAt      time.Time `json:"issued_at"`
	ExpiresAt     time.Time `json:"expires_at"`
	State         string    `json:"state"`
	DecisionID    string    `json:"decision_id"`
	AuditIndex    uint64    `json:"audit_index"`
	DHCHAPHash    string    `json:"dhchap_hash"`
	DHGroup       string    `json:"dh_group"`
	Bidirectional bool      `json:"bidirectional,omitempty"`
	TLS           bool      `json:"tls,omitempty"`
	ReadOnly      bool      `json:"read_only,omitempty"`
	// RemovalPending is only ever set on an ended grant.
	RemovalPending bool `json:"removal_pending,omitempty"`
	// SupersededBy only on a released grant.
	SupersededBy string `json:"superseded_by,omitempty"`
	// ReauthBy and ReauthWhy only on an active grant.
	ReauthBy  *time.Time `json:"reauth_by,omitempty"`
	ReauthWhy string     `json:"reauth_why,omitempty"`
}

func encodeGrant(g *nvmegate.Grant) ([]byte, error) {
	return json.Marshal(grantRecord{V: recordVersion, ID: g.ID, JobID: g.JobID, Tenant: g.Tenant, Node: g.Node, HostNQN: g.HostNQN,
		SubsystemNQN: g.SubsystemNQN, KeyVersion: g.KeyVersion, KeyScope: g.KeyScope, IssuedAt: g.IssuedAt.UTC(), ExpiresAt: g.ExpiresAt.UTC(),
		State: g.State, DecisionID: g.DecisionID, AuditIndex: g.AuditIndex, DHCHAPHash: g.DHCHAPHash, DHGroup: g.DHGroup,
		Bidirectional: g.Bidirectional, TLS: g.TLS, ReadOnly: g.ReadOnly, RemovalPending: g.RemovalPending && g.State != nvmegate.GrantActive,
		SupersededBy: supersededBy(g), ReauthBy: reauthBy(g), ReauthWhy: reauthWhy(g)})
}

// reauthBy is g's renewal deadline as stored: only an active grant has
// one.
func reauthBy(g *nvmegate.Grant) *time.Time {
	if g.State != nvmegate.GrantActive || g.ReauthBy.IsZero() {
		return nil
	}
	t := g.ReauthBy.UTC()
	return &t
}

func reauthWhy(g *nvmegate.Grant) string {
	if reauthBy(g) == nil {
		return ""
	}
	return g.ReauthWhy
}

// storedGrant is g as decodeGrant(encodeGrant(g)) makes it — times in UTC
// without a monotonic reading, RemovalPending only on an ended grant,
// SupersededBy only on a released one — without the JSON round trip: the
// model's copy of a grant a write stores.
func storedGrant(g *nvmegate.Grant) *nvmegate.Grant {
	c := *g
	c.IssuedAt, c.ExpiresAt = g.IssuedAt.UTC(), g.ExpiresAt.UTC()
	c.RemovalPending = g.RemovalPending && g.State != nvmegate.GrantActive
	c.SupersededBy = supersededBy(g)
	c.ReauthBy, c.ReauthWhy = time.Time{}, reauthWhy(g)
	if t := reauthBy(g); t != nil {
		c.ReauthBy = *t
	}
	return &c
}

func decodeGrant(v []byte) (*nvmegate.Grant, error) {
	var r grantRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("store: grant record: %w", err)
	}
	if r.V != recordVersion {
		return nil, fmt.Errorf("store: grant record version %d", r.V)
	}
	g := &nvmegate.Grant{ID: r.ID, JobID: r.JobID, Tenant: r.Tenant, Node: r.Node, HostNQN: r.HostNQN, SubsystemNQN: r.SubsystemNQN,
		KeyVersion: r.KeyVersion, KeyScope: r.KeyScope, IssuedAt: r.IssuedAt, ExpiresAt: r.ExpiresAt, State: r.State, DecisionID: r.DecisionID,
		AuditIndex: r.AuditIndex, DHCHAPHash: r.DHCHAPHash, DHGroup: r.DHGroup, Bidirectional: r.Bidirectional, TLS: r.TLS,
		ReadOnly: r.ReadOnly, RemovalPending: r.RemovalPending, SupersededBy: r.SupersededBy}
	if r.ReauthBy != nil {
		g.ReauthBy, g.ReauthWhy = *r.ReauthBy, r.ReauthWhy
	}
	return g, nil
}

// supersededBy is g's successor as stored: only a released grant has one.
func supersededBy(g *nvmegate.Grant) string {
	if g.State != nvmegate.GrantReleased {
		return ""
	}
	return g.SupersededBy
}

func grantBySubsystemKey(sub, id string) []byte {
	return append(append([]byte(sub), 0), id...)
}

// grantByNodeKey is node\0job\0subsystem\0grant ID: a node's active grants
// in a job on a subsystem are one prefix scan (Connect supersedes them).
func grantByNodeKey(node, job, sub, id string) []byte {
	return append(grantByNodePrefix(node, job, sub), id...)
}

func grantByNodePrefix(node, job, sub string) []byte {
	k := append([]byte(node), 0)
	k = append(append(k, job...), 0)
	return append(append(k, sub...), 0)
}

// grantByHostKey is canonical host NQN\0node\0grant ID: the active grants
// on one host NQN are one prefix scan, ordered by node, so whether any of
// them is another node's is a look at the first and the last.
func grantByHostKey(hostNQN, node, id string) []byte {
	return indexKey(string(indexKey(nvmegate.CanonicalNQN(hostNQN), node)), id)
}

// indexActiveGrantsByHost fills the host NQN index of a store made before
// it existed.
func indexActiveGrantsByHost(tx *bolt.Tx) error {
	idx := tx.Bucket(bucketGrantsByHost)
	return forEachActiveGrant(tx, func(g *nvmegate.Grant) error {
		return idx.Put(grantByHostKey(g.HostNQN, g.Node, g.ID), nil)
	})
}

// hostKeyScopeKey keys host_key_scopes: canonical host NQN 0x00 node 0x00
// key scope.
func hostKeyScopeKey(g *nvmegate.Grant) []byte {
	return indexKey(string(indexKey(nvmegate.CanonicalNQN(g.HostNQN), g.Node)), g.Scope())
}

// noteHostKeyScope records that g's node held g's host NQN under g's key
// scope at g's root version (kept: the highest version). A Get on every
// grant write, a Put only when the version is new.
func noteHostKeyScope(tx *bolt.Tx, g *nvmegate.Grant, put func(name, k, v []byte) error) error {
	b := tx.Bucket(bucketHostKeyScopes)
	k := hostKeyScopeKey(g)
	if v := b.Get(k); len(v) == 8 && binary.BigEndian.Uint64(v) >= g.KeyVersion {
		return nil
	}
	return put(bucketHostKeyScopes, k, binary.BigEndian.AppendUint64(nil, g.KeyVersion))
}

func indexHostKeyScopes(tx *bolt.Tx) error {
	return tx.Bucket(bucketGrants).ForEach(func(_, v []byte) error {
		g, err := decodeGrant(v)
		if err != nil {
			return nil // a corrupt record is reported where it is read
		}
		return noteHostKeyScope(tx, g, func(name, k, v []byte) error { return tx.Bucket(name).Put(k, v) })
	})
}

// HostKeyScope is a key scope under which an identity held grants on a
// host NQN, and the newest root version it held them at: the credentials
// the host could derive there.
type HostKeyScope struct {
	Node    string
	Scope   string
	Version uint64
}

// HostKeyScopes returns every identity's key scopes on host NQN nqn
// (compared canonically), ended grants included, in node and scope order.
func (db *DB) HostKeyScopes(ctx context.Context, nqn string) ([]HostKeyScope, error) {
	var out []HostKeyScope
	err := db.view(ctx, func(tx *bolt.Tx) error {
		p := indexPrefix(nvmegate.CanonicalNQN(nqn))
		c := tx.Bucket(bucketHostKeyScopes).Cursor()
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			node, scope, ok := bytes.Cut(k[len(p):], []byte{keySep})
			if !ok || len(v) != 8 {
				return fmt.Errorf("store: malformed entry %q in %s", k, bucketHostKeyScopes)
			}
			out = append(out, HostKeyScope{Node: string(node), Scope: string(scope), Version: binary.BigEndian.Uint64(v)})
		}
		return nil
	})
	return out, err
}

// otherHostGrants returns the first (in index order) of the active grants
// on canonical host NQN canon whose node is not node, and how many there
// are.
func otherHostGrants(tx *bolt.Tx, canon, node string) (first string, n int) {
	p := indexPrefix(canon)
	c := tx.Bucket(bucketGrantsByHost).Cursor()
	for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
		owner, id, _ := bytes.Cut(k[len(p):], []byte{keySep})
		if string(owner) != node {
			if n == 0 {
				first = string(id)
			}
			n++
		}
	}
	return first, n
}

// checkHostNQN refuses (ECONFLICT) active grant g if its host NQN, compared
// canonically, is bound to another identity or is the host NQN of another
// node's active grant: a target would take g's node for that identity's
// host, with the same credentials. It runs in the grant's commit, so a
// binding made, or a grant committed, after the call was described (the
// gateway checks the binding then too) is seen here. The error names
// neither the other identity nor its grant: the caller is a node.
func checkHostNQN(tx *bolt.Tx, g *nvmegate.Grant) error {
	canon := nvmegate.CanonicalNQN(g.HostNQN)
	if owner := tx.Bucket(bucketHostBindingsByNQN).Get([]byte(canon)); owner != nil && string(owner) != g.Node {
		return nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is bound to another identity; not granted", g.HostNQN)
	}
	// Keys are ordered by node: the first and the last of the NQN's range
	// are g's node's only if all are.
	p := indexPrefix(canon)
	c := tx.Bucket(bucketGrantsByHost).Cursor()
	first, _ := c.Seek(p)
	last, _ := c.Seek(append([]byte(canon), keySep+1))
	if last == nil {
		last, _ = c.Last()
	} else {
		last, _ = c.Prev()
	}
	for _, k := range [][]byte{first, last} {
		if k == nil || !bytes.HasPrefix(k, p) {
			continue
		}
		if owner, _, _ := bytes.Cut(k[len(p):], []byte{keySep}); string(owner) != g.Node {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is in use by another identity's grant; not granted", g.HostNQN)
		}
	}
	return nil
}

// indexActiveGrantsByNode fills the node index of a store made before it
// existed.
func indexActiveGrantsByNode(tx *bolt.Tx) error {
	idx := tx.Bucket(bucketGrantsByNode)
	return forEachActiveGrant(tx, func(g *nvmegate.Grant) error {
		return idx.Put(grantByNodeKey(g.Node, g.JobID, g.SubsystemNQN, g.ID), nil)
	})
}

// forEachActiveGrant calls fn with every grant in the index of active
// grants (by subsystem), failing on an index entry without its grant.
func forEachActiveGrant(tx *bolt.Tx, fn func(*nvmegate.Grant) error) error {
	grants := tx.Bucket(bucketGrants)
	return tx.Bucket(bucketGrantsBySubsystem).ForEach(func(k, _ []byte) error {
		i := bytes.IndexByte(k, 0)
		if i < 0 {
			return fmt.Errorf("store: malformed key in %s", bucketGrantsBySubsystem)
		}
		v := grants.Get(k[i+1:])
		if v == nil {
			return fmt.Errorf("store: index %s points to a missing grant %q", bucketGrantsBySubsystem, k[i+1:])
		}
		g, err := decodeGrant(v)
		if err != nil {
			return err
		}
		return fn(g)
	})
}

// NodeGrants returns the active grants of a node in a job on a subsystem
// (normally at most one), without reading the subsystem's other grants, in
// grant ID order.
func (db *DB) NodeGrants(ctx context.Context, node, jobID, subsystemNQN string) ([]*nvmegate.Grant, error) {
	return db.model.nodeGrants(ctx, node, jobID+"\x00"+subsystemNQN+"\x00")
}

// NodeActiveGrants returns every active grant of a node, in any job and on
// any subsystem (those that share its host entry on a target), ordered by
// job, subsystem and grant ID.
func (db *DB) NodeActiveGrants(ctx context.Context, node string) ([]*nvmegate.Grant, error) {
	return db.model.nodeGrants(ctx, node, "")
}

// PutGrant stores a grant, new or changed (its job, host and subsystem
// never change). An active grant whose host NQN (compared canonically) is
// bound to another identity, or used by an active grant of another node,
// is refused with ECONFLICT: one host NQN, one identity's grants.
func (db *DB) PutGrant(ctx context.Context, g *nvmegate.Grant) error {
	return db.PutGrants(ctx, g)
}

// PutGrants stores grants in one transaction (one commit): a new grant
// and the one it supersedes change together.
func (db *DB) PutGrants(ctx context.Context, gs ...*nvmegate.Grant) error {
	return db.PutGrantsMoving(ctx, gs, nil, nil, nvmegate.HostEntry{})
}

// HostEntry is the root's nvmegate.HostEntry: what the grants sharing one
// host entry on a target must agree on. The name stays for callers of
// PutGrantsMoving.
type HostEntry = nvmegate.HostEntry

// EntryOf is g's host entry (g.HostEntry()).
func EntryOf(g *nvmegate.Grant) HostEntry { return g.HostEntry() }

// PutGrantsMoving stores gs and, in the same commit, gives the grants
// named in move the host entry to. Each moved grant is read as it is in
// that commit, so a concurrent renewal's other changes (its expiry, its
// decision) stay; grants that ended meanwhile are left alone, and with
// from set, so is a grant whose entry is no longer *from (putting a move
// back must not undo a later one).
func (db *DB) PutGrantsMoving(ctx context.Context, gs []*nvmegate.Grant, move []string, from *nvmegate.HostEntry, to nvmegate.HostEntry) error {
	if db.forwards() {
		if ok, err := db.remote(ctx, "put_grants_moving", &putGrantsMovingOp{Grants: gs, Move: move, From: from, To: to}); ok {
			return err
		}
	}
	_, err := db.putGrants(ctx, gs, move, from, to, false, nil, nil, nil)
	return err
}

// OpenGrant stores g, a grant being opened (issued or renewed), in one
// commit with what it changes for its node: the grants named in move take
// g's host entry (as PutGrantsMoving), and with supersede, the node's
// other active grants in g's job on g's subsystem — found in the commit,
// so two concurrent connects of a node cannot both stay active — end as
// released with SupersededBy g.ID, pending removal where their host is
// not g's (the node's binding changed: the target must remove it). It
// returns the superseded grants as stored. UndoOpening puts them back if
// the target refuses g.
//
// With at set, the commit also checks that g's node still has the host
// binding the call was decided with (BindingAt): a binding removed,
// changed or added meanwhile refuses g (ECONFLICT), so a connect decided
// before an admin unbound its node cannot outlive the removal.
func (db *DB) OpenGrant(ctx context.Context, g *nvmegate.Grant, move []string, supersede bool, at *BindingAt) ([]*nvmegate.Grant, error) {
	if g != nil && db.forwards() {
		o := &openGrantOp{Grant: g, Move: move, Supersede: supersede, At: at}
		if ok, err := db.remote(ctx, "open_grant", o); ok {
			return o.opened(g, err)
		}
	}
	if g == nil || g.State != nvmegate.GrantActive {
		return nil, nvmegate.Invalid("", "an active grant is required")
	}
	return db.putGrants(ctx, []*nvmegate.Grant{g}, move, nil, g.HostEntry(), supersede, at, nil, nil)
}

// OpenGrantRecorded is OpenGrant on a journaled store (Journaled), with
// the opening's entry in the same commit — its one durable round: the
// entry names the grants g supersedes as decided there (OpeningEntry),
// and g.AuditIndex becomes its entry's index. On a store that is not
// journaled it fails: the caller appends the entry itself first.
func (db *DB) OpenGrantRecorded(ctx context.Context, g *nvmegate.Grant, move []string, supersede bool, at *BindingAt,
	entry OpeningEntry) ([]*nvmegate.Grant, error) {
	if g != nil && db.forwards() {
		o := &openGrantOp{Grant: g, Move: move, Supersede: supersede, At: at, Entry: &entry}
		if ok, err := db.remote(ctx, "open_grant", o); ok {
			return o.opened(g, err)
		}
	}
	if g == nil || g.State != nvmegate.GrantActive {
		return nil, nvmegate.Invalid("", "an active grant is required")
	}
	if db.journal == nil {
		return nil, errors.New("store: an opening with its entry needs a journaled store")
	}
	if entry.At < 0 || entry.At > len(entry.Entry.Detail) {
		return nil, nvmegate.Invalid("", "the opening entry's insertion point %d is outside its detail", entry.At)
	}
	return db.putGrants(ctx, []*nvmegate.Grant{g}, move, nil, g.HostEntry(), supersede, at, &entry, nil)
}

// OpeningEntry is an opening's entry as its caller builds it, before the
// commit decides what it supersedes: the commit inserts "; supersedes
// <ids>" into Entry.Detail at byte At. It is data, not a function, so a
// follower forwards it to the leader that sequences the opening.
type OpeningEntry struct {
	Entry audit.Entry `json:"entry"`
	At    int         `json:"at"`
}

// entryFor is the entry with the grants superseded named.
func (o *OpeningEntry) entryFor(superseded []*nvmegate.Grant) audit.Entry {
	e := o.Entry
	if len(superseded) > 0 {
		ids := make([]string, len(superseded))
		for i, g := range superseded {
			ids[i] = g.ID
		}
		e.Detail = e.Detail[:o.At] + "; supersedes " + strings.Join(ids, ", ") + e.Detail[o.At:]
	}
	return e
}

// PutGrantsRecorded is PutGrants on a journaled store (Journaled), with
// entries, the step's record (an end's entries), durable in the same
// commit: its one round. On a store that is not journaled it fails: the
// caller appends the entries itself first.
func (db *DB) PutGrantsRecorded(ctx context.Context, gs []*nvmegate.Grant, entries []audit.Entry) error {
	if db.forwards() {
		if ok, err := db.remote(ctx, "put_grants_recorded", &putGrantsRecordedOp{Grants: gs, Entries: entries}); ok {
			return err
		}
	}
	if db.journal == nil || len(entries) == 0 {
		return errors.New("store: grants with their entries need a journaled store and entries")
	}
	_, err := db.putGrants(ctx, gs, nil, nil, nvmegate.HostEntry{}, false, nil, nil, entries)
	return err
}

// BindingAt is the host binding a call was decided with: the node's stored
// binding (Bound, as read: its CreatedAt tells a binding removed and made
// again from the one read), or none (the node's default host NQN).
type BindingAt struct {
	Bound   bool
	Binding nvmegate.HostBinding
}

// checkBindingAt refuses (ECONFLICT) if node's binding, as tx sees it, is
// not at.
func checkBindingAt(tx *txn, node string, at *BindingAt) error {
	b, err := tx.bindingOf(node)
	switch {
	case err != nil:
		return err
	case b == nil:
		if !at.Bound {
			return nil
		}
	case at.Bound && b.SPIFFEID == at.Binding.SPIFFEID && nvmegate.CanonicalNQN(b.HostNQN) == nvmegate.CanonicalNQN(at.Binding.HostNQN) &&
		b.Tenant == at.Binding.Tenant && b.CreatedAt.Equal(at.Binding.CreatedAt):
		return nil
	}
	return nvmegate.Errorf(nvmegate.ECONFLICT, "the node's host binding changed while it connected; no grant was made")
}

func (db *DB) putGrants(ctx context.Context, gs []*nvmegate.Grant, move []string, from *nvmegate.HostEntry, to nvmegate.HostEntry, supersede bool, at *BindingAt,
	entry *OpeningEntry, entries []audit.Entry) ([]*nvmegate.Grant, error) {
	vals := make([][]byte, len(gs))
	stored := make([]*nvmegate.Grant, len(gs)) // the model's copies
	for i, g := range gs {
		if g == nil {
			return nil, nvmegate.Invalid("", "a grant is required")
		}
		if err := nvmegate.ValidateGrantID("grant_id", g.ID); err != nil {
			return nil, err
		}
		var err error
		if vals[i], err = encodeGrant(g); err != nil {
			return nil, err
		}
		stored[i] = storedGrant(g)
	}
	var ended []*nvmegate.Grant
	// Batched with concurrent grant writes (one commit for a storm's
	// group); the function is safe to run twice.
	write := func(tx *txn) error {
		ended = ended[:0]
		if entry != nil {
			// Its entry is the commit's first: the grant names it.
			gs[0].AuditIndex = tx.first
			var err error
			if vals[0], err = encodeGrant(gs[0]); err != nil {
				return err
			}
			stored[0] = storedGrant(gs[0])
		}
		if at != nil {
			if err := checkBindingAt(tx, gs[0].Node, at); err != nil {
				return err
			}
		}
		for i := range gs {
			// A grant opened or renewed in a job that finished meanwhile
			// (after the call's decision) would outlive the job's end:
			// the end revokes only what was active when it committed.
			if g := stored[i]; g.State == nvmegate.GrantActive {
				if st := tx.jobState(g.JobID); st != "" && st != nvmegate.JobActive {
					return nvmegate.Errorf(nvmegate.ECONFLICT, "job %s is %s; not granted", g.JobID, st)
				}
				// And one decided before its node left the job.
				if !tx.jobHasNode(g.JobID, g.Node) {
					return nvmegate.Errorf(nvmegate.ECONFLICT, "node %s is no longer in job %s; not granted", g.Node, g.JobID)
				}
			}
			if err := putGrant(tx, stored[i], vals[i]); err != nil {
				return err
			}
		}
		for _, id := range move {
			cur, err := txGrant(tx, id)
			if err != nil || cur == nil {
				return err
			}
			if cur.State != nvmegate.GrantActive || (from != nil && cur.HostEntry() != *from) {
				continue
			}
			cur.KeyVersion, cur.DHCHAPHash, cur.DHGroup, cur.Bidirectional = to.KeyVersion, to.DHCHAPHash, to.DHGroup, to.Bidirectional
			if err := encodeAndPut(tx, cur); err != nil {
				return err
			}
		}
		if !supersede {
			return nil
		}
		g := stored[0]
		prefix := grantByNodePrefix(g.Node, g.JobID, g.SubsystemNQN)
		var earlier []string
		c := tx.Bucket(bucketGrantsByNode).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if id := string(k[len(prefix):]); id != g.ID {
				earlier = append(earlier, id)
			}
		}
		for _, id := range earlier {
			cur, err := txGrant(tx, id)
			if err != nil || cur == nil {
				return err
			}
			if cur.State != nvmegate.GrantActive {
				continue
			}
			cur.State, cur.SupersededBy = nvmegate.GrantReleased, gs[0].ID
			cur.RemovalPending = cur.HostRef() != gs[0].HostRef()
			if err := encodeAndPut(tx, cur); err != nil {
				return err
			}
			c := *cur
			ended = append(ended, &c)
		}
		return nil
	}
	var err error
	switch {
	case entry != nil:
		err = db.propose(ctx, nil, func(tx *txn) error {
			if err := write(tx); err != nil {
				return err
			}
			tx.entries = append(tx.entries, entry.entryFor(ended))
			return nil
		})
	case len(entries) > 0:
		err = db.propose(ctx, entries, write)
	default:
		err = db.batch(ctx, write)
	}
	if err != nil {
		return nil, err
	}
	return ended, nil
}

// UndoOpening ends g, an issued grant its target did not take, as revoked
// pending removal (the target may hold its host until it follows the
// store back), final (never put back itself), and in the same commit
// settles the grants g superseded (the grants_superseded index): if g is
// still active, each becomes active again — unless its job is no longer
// active, it expired, or its host NQN is now another identity's; if a
// later connect of the node superseded g meanwhile, they wait on that
// one instead; if g ended otherwise (a revocation, the job's end, an
// expiry), they are final. It returns the grants put back.
func (db *DB) UndoOpening(ctx context.Context, g *nvmegate.Grant) ([]*nvmegate.Grant, error) {
	if g != nil && db.forwards() {
		o := &undoOpeningOp{Grant: g}
		if ok, err := db.remote(ctx, "undo_opening", o); ok {
			return o.Back, err
		}
	}
	if g == nil {
		return nil, nvmegate.Invalid("", "a grant is required")
	}
	now := db.now()
	var back []*nvmegate.Grant
	err := db.batch(ctx, func(tx *txn) error {
		back = back[:0]
		cur, err := txGrant(tx, g.ID)
		if err != nil {
			return err
		}
		undone := *g
		if cur != nil {
			undone = *cur
		}
		active := undone.State == nvmegate.GrantActive
		successor := "" // a later connect that superseded g
		if undone.State == nvmegate.GrantReleased {
			successor = undone.SupersededBy
		}
		for _, id := range waitingOn(tx, g.ID) {
			o, err := txGrant(tx, id)
			if err != nil {
				return err
			}
			if o == nil || o.State != nvmegate.GrantReleased || o.SupersededBy != g.ID {
				continue
			}
			switch {
			case successor != "":
				o.SupersededBy = successor
			case active && o.ExpiresAt.After(now) && jobActive(tx, o.JobID) && tx.jobHasNode(o.JobID, o.Node):
				o.State, o.SupersededBy, o.RemovalPending = nvmegate.GrantActive, "", false
				if checkHostNQN(tx.Tx, o) != nil {
					o.State = nvmegate.GrantReleased
				}
			default:
				o.SupersededBy = ""
			}
			val, err := encodeGrant(o)
			if err != nil {
				return err
			}
			if err := putGrantReinstating(tx, o, val); err != nil {
				return err
			}
			if o.State == nvmegate.GrantActive {
				c := *o
				back = append(back, &c)
			}
		}
		if active || undone.State == nvmegate.GrantReleased {
			undone.State = nvmegate.GrantRevoked
		}
		undone.RemovalPending, undone.SupersededBy = true, ""
		return encodeAndPut(tx, &undone)
	})
	if err != nil {
		return nil, err
	}
	return back, nil
}

// waitingOn lists the grants superseded by successor that it may still
// put back (grants_superseded).
func waitingOn(tx *txn, successor string) []string {
	prefix := append([]byte(successor), 0)
	var out []string
	c := tx.Bucket(bucketGrantsSuperseded).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		out = append(out, string(k[len(prefix):]))
	}
	return out
}

// jobActive: job id is active in tx, or unknown to the store.
func jobActive(tx *txn, id string) bool {
	st := tx.jobState(id)
	return st == "" || st == nvmegate.JobActive
}

// txGrant reads grant id in tx (nil if there is none), as a copy the
// caller may change: as this transaction wrote it, else as the model
// holds it (an active grant, as last committed: the transaction holds the
// writer's lock, so no commit lands meanwhile), else from the file (an
// ended grant), without decoding a record for the grants a connect
// touches.
func txGrant(tx *txn, id string) (*nvmegate.Grant, error) {
	for i := len(tx.ops) - 1; i >= 0; i-- {
		if g := tx.ops[i].grant; g != nil && g.ID == id {
			c := *g
			return &c, nil
		}
	}
	tx.model.mu.RLock()
	g := tx.model.grants[id]
	tx.model.mu.RUnlock()
	if g != nil {
		c := *g
		return &c, nil
	}
	v := tx.Bucket(bucketGrants).Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	return decodeGrant(v)
}

// encodeAndPut stores g, the transaction's own copy.
func encodeAndPut(tx *txn, g *nvmegate.Grant) error {
	val, err := encodeGrant(g)
	if err != nil {
		return err
	}
	return putGrant(tx, g, val)
}

// putGrant stores g (encoded as val) and records it for the model, which
// keeps g: it must be the transaction's own copy.
func putGrant(tx *txn, g *nvmegate.Grant, val []byte) error {
	return putGrantAs(tx, g, val, false)
}

// putGrantReinstating is putGrant for UndoOpening, the one write that may
// make an ended (superseded) grant active again.
func putGrantReinstating(tx *txn, g *nvmegate.Grant, val []byte) error {
	return putGrantAs(tx, g, val, true)
}

func putGrantAs(tx *txn, g *nvmegate.Grant, val []byte, reinstate bool) error {
	prevOf, err := txGrant(tx, g.ID)
	if err != nil {
		return err
	}
	if prev := prevOf; prev != nil {
		// The node too: its index entry is keyed by it.
		if prev.SubsystemNQN != g.SubsystemNQN || prev.HostNQN != g.HostNQN || prev.JobID != g.JobID || prev.Node != g.Node {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "grant %s cannot change its job, node, host or subsystem", g.ID)
		}
		// Ended is final: a renewal racing a revocation must not bring
		// the grant back.
		if prev.State != nvmegate.GrantActive && g.State == nvmegate.GrantActive && !(reinstate && prev.State == nvmegate.GrantReleased) {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "grant %s has ended (%s)", g.ID, prev.State)
		}
	}
	if g.State == nvmegate.GrantActive {
		if err := checkHostNQN(tx.Tx, g); err != nil {
			return err
		}
	}
	if err := indexSuperseded(tx, g, prevOf); err != nil {
		return err
	}
	tx.record(op{grant: g})
	if err := put(tx, bucketGrants, []byte(g.ID), val); err != nil {
		return err
	}
	if err := noteHostKeyScope(tx.Tx, g, func(name, k, v []byte) error { return put(tx, name, k, v) }); err != nil {
		return err
	}
	// The index holds active grants only: a target's desired state is
	// read from it, and ended grants must not slow that down.
	k := grantBySubsystemKey(g.SubsystemNQN, g.ID)
	nk := grantByNodeKey(g.Node, g.JobID, g.SubsystemNQN, g.ID)
	hk := grantByHostKey(g.HostNQN, g.Node, g.ID)
	if g.State == nvmegate.GrantActive {
		if err := put(tx, bucketGrantsByNode, nk, nil); err != nil {
			return err
		}
		if err := put(tx, bucketGrantsByHost, hk, nil); err != nil {
			return err
		}
		// An active grant is pending nothing (one put back by
		// UndoOpening may have been).
		if err := del(tx, bucketGrantsPending, []byte(g.ID)); err != nil {
			return err
		}
		return put(tx, bucketGrantsBySubsystem, k, nil)
	}
	if err := del(tx, bucketGrantsByNode, nk); err != nil {
		return err
	}
	if err := del(tx, bucketGrantsByHost, hk); err != nil {
		return err
	}
	if err := del(tx, bucketGrantsBySubsystem, k); err != nil {
		return err
	}
	if g.RemovalPending {
		return put(tx, bucketGrantsPending, []byte(g.ID), nil)
	}
	return del(tx, bucketGrantsPending, []byte(g.ID))
}

// indexSuperseded keeps grants_superseded for g (prev: as stored before,
// or nil): a released grant with SupersededBy is indexed under its
// successor. And a grant that ends other than by being superseded — a
// release, a revocation, an expiry, an undo — makes the grants it
// superseded final: only its own undo may put them back, and that can no
// longer come.
func indexSuperseded(tx *txn, g, prev *nvmegate.Grant) error {
	if prev != nil && prev.State == nvmegate.GrantReleased && prev.SupersededBy != "" {
		if err := del(tx, bucketGrantsSuperseded, supersededKey(prev.SupersededBy, prev.ID)); err != nil {
			return err
		}
	}
	if g.State == nvmegate.GrantReleased && g.SupersededBy != "" {
		return put(tx, bucketGrantsSuperseded, supersededKey(g.SupersededBy, g.ID), nil)
	}
	if prev == nil || prev.State != nvmegate.GrantActive || g.State == nvmegate.GrantActive {
		return nil
	}
	for _, id := range waitingOn(tx, g.ID) {
		o, err := txGrant(tx, id)
		if err != nil {
			return err
		}
		if o == nil || o.SupersededBy != g.ID {
			continue
		}
		o.SupersededBy = ""
		if err := encodeAndPut(tx, o); err != nil {
			return err
		}
	}
	return nil
}

func supersededKey(successor, id string) []byte {
	return append(append([]byte(successor), 0), id...)
}

// PendingRemovals returns the ended grants whose removal from their
// target is not acknowledged yet, in grant ID order.
func (db *DB) PendingRemovals(ctx context.Context) ([]*nvmegate.Grant, error) {
	return db.model.pendingRemovals(ctx)
}

// PendingRemovalCount is len(PendingRemovals), without copying (a metric).
func (db *DB) PendingRemovalCount() int { return db.model.pendingRemovalCount() }

// SettleRemovals records that the targets acknowledged states without the
// hosts of the ended grants ids: they are no longer pending removal. A
// grant that is not pending (settled already, or active) is left alone.
func (db *DB) SettleRemovals(ctx context.Context, ids []string) error {
	if len(ids) > 0 {
		if ok, err := db.remote(ctx, "settle_removals", &settleRemovalsOp{IDs: ids}); ok {
			return err
		}
	}
	if len(ids) == 0 {
		return nil
	}
	return db.batch(ctx, func(tx *txn) error {
		for _, id := range ids {
			if tx.Bucket(bucketGrantsPending).Get([]byte(id)) == nil {
				continue
			}
			v := tx.Bucket(bucketGrants).Get([]byte(id))
			if v == nil {
				return fmt.Errorf("store: index %s points to a missing grant %q", bucketGrantsPending, id)
			}
			g, err := decodeGrant(v)
			if err != nil {
				return err
			}
			g.RemovalPending = false
			val, err := encodeGrant(g)
			if err != nil {
				return err
			}
			if err := putGrant(tx, g, val); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReauthMark asks an active grant to renew by a deadline
// (nvmegate.Grant.ReauthBy): a change made its obligations stronger.
type ReauthMark struct {
	GrantID string
	// DecisionID is the decision the grant held when it was re-decided:
	// a grant renewed since (a new decision, under the obligations in
	// force) is not marked.
	DecisionID string
	By         time.Time
	Why        string
}

// RequireReauth sets the renewal deadlines of marks, in one commit, on
// the grants still active under the decision each names; an earlier
// deadline already set stays. It returns the grants it marked, as stored.
func (db *DB) RequireReauth(ctx context.Context, marks []ReauthMark) ([]*nvmegate.Grant, error) {
	if len(marks) > 0 && db.forwards() {
		o := &requireReauthOp{Marks: marks}
		if ok, err := db.remote(ctx, "require_reauth", o); ok {
			return o.Marked, err
		}
	}
	var out []*nvmegate.Grant
	err := db.batch(ctx, func(tx *txn) error {
		out = out[:0]
		for _, m := range marks {
			g, err := txGrant(tx, m.GrantID)
			if err != nil {
				return err
			}
			if g == nil || g.State != nvmegate.GrantActive || g.DecisionID != m.DecisionID ||
				!g.ReauthBy.IsZero() && !m.By.Before(g.ReauthBy) {
				continue
			}
			c := *g
			c.ReauthBy, c.ReauthWhy = m.By, m.Why
			val, err := encodeGrant(&c)
			if err != nil {
				return err
			}
			if err := putGrant(tx, &c, val); err != nil {
				return err
			}
			out = append(out, storedGrant(&c))
		}
		return nil
	})
	return out, err
}

// Grant returns a grant, or ENOTFOUND. An active grant is served from the
// model, an ended one read from the file. An active grant past its expiry
// is reported as expired.
func (db *DB) Grant(ctx context.Context, id string) (*nvmegate.Grant, error) {
	g, ok, err := db.model.activeGrant(ctx, id)
	if ok {
		if err != nil {
			return nil, err
		}
		db.expireGrant(g)
		return g, nil
	}
	if err != nil {
		return nil, err
	}
	err = db.view(ctx, func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketGrants).Get([]byte(id))
		if v == nil {
			return nvmegate.Errorf(nvmegate.ENOTFOUND, "grant %q not found", id)
		}
		var err error
		g, err = decodeGrant(v)
		return err
	})
	if err != nil {
		return nil, err
	}
	db.expireGrant(g)
	return g, nil
}

// expireGrant shows an active grant past its expiry as expired (the
// targets drop it at their next reconcile whatever the stored state says).
func (db *DB) expireGrant(g *nvmegate.Grant) {
	if g.State == nvmegate.GrantActive && !db.now().Before(g.ExpiresAt) {
		g.State = nvmegate.GrantExpired
	}
}

// ListGrants returns one page of grants in ID order.
func (db *DB) ListGrants(ctx context.Context, f GrantFilter, page Page) ([]*nvmegate.Grant, string, error) {
	size, after, err := page.parse(kindGrants)
	if err != nil {
		return nil, "", err
	}
	var (
		items []*nvmegate.Grant
		next  []byte
	)
	err = db.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketGrants).Cursor()
		items, next, err = scanPage(c, nil, after, size, func(_, v []byte) (*nvmegate.Grant, bool, []byte, error) {
			g, err := decodeGrant(v)
			if err != nil {
				return nil, false, nil, err
			}
			db.expireGrant(g)
			return g, (f.JobID == "" || g.JobID == f.JobID) && (f.Node == "" || g.Node == f.Node) && (f.State == "" || g.State == f.State) &&
				(!f.RemovalPending || g.RemovalPending), nil, nil
		})
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return items, encodeToken(kindGrants, next), nil
}

// SubsystemGrants returns the active grants of a subsystem (what its
// target must allow), in grant ID order.
func (db *DB) SubsystemGrants(ctx context.Context, subsystemNQN string) ([]*nvmegate.Grant, error) {
	return db.model.subsystemGrants(ctx, subsystemNQN)
}

// ActiveGrants returns every grant stored as active (past its expiry or
// not), ordered by subsystem and grant ID, from the read model.
func (db *DB) ActiveGrants(ctx context.Context) ([]*nvmegate.Grant, error) {
	return db.model.activeGrants(ctx)
}

// ExpiredGrants returns the grants still stored as active whose expiry, or
// renewal deadline (Grant.ReauthBy), has passed (the sweeper ends them),
// ordered by subsystem and grant ID.
func (db *DB) ExpiredGrants(ctx context.Context) ([]*nvmegate.Grant, error) {
	return db.model.expiredGrants(ctx, db.now())
}

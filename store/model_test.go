package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/nvmegate/nvmegate"
)

// stepClock stands still until the test moves it; stores sharing one read
// the same time, so their expiry rules agree.
type stepClock struct{ d atomic.Int64 }

func (c *stepClock) Now() time.Time          { return t0.Add(time.Duration(c.d.Load())) }
func (c *stepClock) Advance(d time.Duration) { c.d.Add(int64(d)) }

// modelWorld is what the randomized test picks names from.
type modelWorld struct {
	targets, subs, nodes []string
	jobs, grants         []string // every ID tried
	nextJob, nextGrant   int
}

func tenantOf(sub int) string { return []string{"acme", "globex"}[sub%2] }

// TestModelFollowsFileRandomized makes random writes of every kind (some
// refused, some group-committed concurrently) and after each one checks
// every read the model serves against a fresh Open of a copy of the file
// and against the records in the file.
func TestModelFollowsFileRandomized(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			clock := new(stepClock)
			db, err := Open(filepath.Join(t.TempDir(), "store.db"), Options{Now: clock.Now})
			must(t, err)
			defer db.Close()
			noSync(db)
			w := &modelWorld{}
			for i := range 3 {
				w.targets = append(w.targets, fmt.Sprintf("t%d", i))
			}
			for i := range 6 {
				w.subs, w.nodes = append(w.subs, subNQN(i)), append(w.nodes, nodeID(i))
			}
			rng := rand.New(rand.NewPCG(seed, 2026))
			counts := map[string]int{}
			dir := t.TempDir()
			for step := range 200 {
				what, err := randomWrite(t, db, w, rng, clock)
				switch code := nvmegate.ErrorCode(err); {
				case err == nil:
					counts["ok"]++
				case code == nvmegate.EINTERNAL:
					t.Fatalf("step %d (%s): %v", step, what, err)
				default:
					counts[code]++
				}
				checkModel(t, db, w, clock, dir)
				clock.Advance(20 * time.Second)
			}
			t.Logf("outcomes: %v; revision %d", counts, db.Revision())
			if counts["ok"] < 80 || counts[nvmegate.ECONFLICT] == 0 || counts[nvmegate.EEXISTS] == 0 {
				t.Errorf("weak run: %v", counts)
			}
		})
	}
}

// randomWrite makes one random write (or a storm of concurrent grant
// writes) and returns what it did and its error.
func randomWrite(t *testing.T, db *DB, w *modelWorld, rng *rand.Rand, clock *stepClock) (string, error) {
	ctx := context.Background()
	pick := func(s []string) string {
		if len(s) == 0 {
			return "none"
		}
		return s[rng.IntN(len(s))]
	}
	sub := rng.IntN(len(w.subs))
	mintGrant := func() *nvmegate.Grant {
		w.nextGrant++
		node := rng.IntN(len(w.nodes))
		g := newGrant(node, w.subs[rng.IntN(len(w.subs))])
		g.ID, g.JobID = fmt.Sprintf("grant-%05d", w.nextGrant), pick(w.jobs)
		g.IssuedAt, g.ExpiresAt = clock.Now().UTC(), clock.Now().Add(time.Duration(1+rng.IntN(10))*time.Minute).UTC()
		w.grants = append(w.grants, g.ID)
		return g
	}
	// current reads a grant to change; nil if there is none.
	current := func() *nvmegate.Grant {
		g, err := db.Grant(ctx, pick(w.grants))
		if err != nil {
			return nil
		}
		return g
	}
	entry := func() HostEntry {
		return HostEntry{KeyVersion: uint64(1 + rng.IntN(4)), DHCHAPHash: "sha384", DHGroup: "ffdhe3072", Bidirectional: rng.IntN(2) == 0}
	}

	switch rng.IntN(22) {
	case 0:
		return "create target", db.CreateTarget(ctx, newTarget(pick(w.targets)))
	case 1:
		return "delete target", db.DeleteTarget(ctx, pick(w.targets))
	case 2, 3:
		return "create subsystem", db.CreateSubsystem(ctx, newSubsystem(w.subs[sub], pick(w.targets), tenantOf(sub)))
	case 4:
		return "delete subsystem", db.DeleteSubsystem(ctx, w.subs[sub])
	case 5, 6:
		return "create namespace", db.CreateNamespace(ctx, newNamespace(w.subs[sub], uint32(1+rng.IntN(3)), tenantOf(sub)))
	case 7:
		return "delete namespace", db.DeleteNamespace(ctx, w.subs[sub], uint32(1+rng.IntN(3)))
	case 8:
		h := newBinding(rng.IntN(len(w.nodes)), "")
		h.HostNQN = hostNQN(rng.IntN(len(w.nodes))) // sometimes another node's
		return "create host binding", db.CreateHostBinding(ctx, h)
	case 9:
		return "delete host binding", db.DeleteHostBinding(ctx, pick(w.nodes))
	case 10:
		tenant := tenantOf(sub)
		ns, _, err := db.ListNamespaces(ctx, NamespaceFilter{Tenant: tenant}, Page{})
		must(t, err)
		j := newJob(fmt.Sprintf("job-%03d", w.nextJob), tenant, nvmegate.JobNamespace{SubsystemNQN: w.subs[sub], NSID: 1, Mode: nvmegate.ModeReadOnly})
		if len(ns) > 0 {
			n := ns[rng.IntN(len(ns))]
			j.Namespaces[0] = nvmegate.JobNamespace{SubsystemNQN: n.SubsystemNQN, NSID: n.NSID, Mode: nvmegate.ModeReadWrite}
		}
		j.Nodes = nil
		for _, n := range w.nodes {
			if rng.IntN(2) == 0 {
				j.Nodes = append(j.Nodes, n)
			}
		}
		if len(j.Nodes) == 0 {
			j.Nodes = w.nodes[:1]
		}
		j.ExpiresAt = clock.Now().Add(time.Duration(5+rng.IntN(55)) * time.Minute)
		w.nextJob++
		w.jobs = append(w.jobs, j.ID)
		return "create job", db.CreateJob(ctx, j)
	case 11:
		_, _, err := db.FinishJob(ctx, pick(w.jobs), nil)
		return "finish job", err
	case 12, 13, 14:
		var gs []*nvmegate.Grant
		for range 1 + rng.IntN(3) {
			g := mintGrant()
			gs = append(gs, g)
			// Supersede the node's grants in the job on the subsystem.
			old, err := db.NodeGrants(ctx, g.Node, g.JobID, g.SubsystemNQN)
			must(t, err)
			for _, o := range old {
				o.State = nvmegate.GrantReleased
				gs = append(gs, o)
			}
		}
		return "put grants", db.PutGrants(ctx, gs...)
	case 15:
		g := current()
		if g == nil {
			return "end grant", nil
		}
		g.State = []string{nvmegate.GrantReleased, nvmegate.GrantRevoked, nvmegate.GrantExpired}[rng.IntN(3)]
		g.RemovalPending = rng.IntN(2) == 0
		return "end grant", db.PutGrant(ctx, g)
	case 16:
		g := current()
		if g == nil {
			return "renew grant", nil
		}
		g.ExpiresAt = clock.Now().Add(time.Duration(1+rng.IntN(10)) * time.Minute).UTC()
		return "renew grant", db.PutGrant(ctx, g)
	case 17:
		g := current()
		if g == nil {
			return "revive grant", nil
		}
		g.State = nvmegate.GrantActive
		return "revive grant", db.PutGrant(ctx, g)
	case 18:
		g := mintGrant()
		active, err := db.NodeActiveGrants(ctx, g.Node)
		must(t, err)
		var move []string
		var from *HostEntry
		for _, a := range active {
			move = append(move, a.ID)
			if e := EntryOf(a); from == nil && rng.IntN(2) == 0 {
				from = &e
			}
		}
		move = append(move, "grant-nope")
		return "put grant moving", db.PutGrantsMoving(ctx, []*nvmegate.Grant{g}, move, from, entry())
	case 19:
		// A storm: concurrent writes share commits; a refused one in a
		// group makes the group roll back and run one by one.
		var gs []*nvmegate.Grant
		for range 6 {
			gs = append(gs, mintGrant())
		}
		if g := current(); g != nil && rng.IntN(2) == 0 {
			g.State = nvmegate.GrantActive // refused if it has ended
			gs = append(gs, g)
		}
		errs := make([]error, len(gs))
		var wg sync.WaitGroup
		for i, g := range gs {
			wg.Go(func() { errs[i] = db.PutGrant(ctx, g) })
		}
		wg.Wait()
		return "grant storm", errors.Join(errs...)
	case 20:
		// The targets followed some of the pending removals.
		pending, err := db.PendingRemovals(ctx)
		must(t, err)
		var ids []string
		for _, g := range pending {
			if rng.IntN(2) == 0 {
				ids = append(ids, g.ID)
			}
		}
		return "settle removals", db.SettleRemovals(ctx, append(ids, "grant-nope"))
	default:
		g := current()
		if g == nil {
			return "change a grant's node", nil
		}
		g.Node = pick(w.nodes)
		return "change a grant's node", db.PutGrant(ctx, g)
	}
}

// checkModel checks the reads db serves from its model against those of a
// store freshly opened on a copy of its file (made in dir), and against
// the records in the file.
func checkModel(t *testing.T, db *DB, w *modelWorld, clock *stepClock, dir string) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(dir, "copy.db")
	must(t, db.bolt.View(func(tx *bolt.Tx) error { return tx.CopyFile(path, 0o600) }))
	fresh, err := Open(path, Options{Now: clock.Now})
	must(t, err)
	defer func() {
		must(t, fresh.Close())
		must(t, os.Remove(path))
	}()

	if db.Revision() != fresh.Revision() {
		t.Fatalf("revision %d, the file's %d", db.Revision(), fresh.Revision())
	}
	db.model.mu.RLock()
	same := reflect.DeepEqual(db.model.records, fresh.model.records)
	db.model.mu.RUnlock()
	if !same {
		t.Fatalf("the model differs from one loaded from the file:\n%+v\nloaded:\n%+v", db.model.records, fresh.model.records)
	}

	// Every read, live against fresh.
	cmpRead := func(what string, read func(*DB) (any, error)) {
		t.Helper()
		got, gotErr := read(db)
		want, wantErr := read(fresh)
		sameResult(t, what, got, gotErr, want, wantErr)
	}
	for _, id := range w.targets {
		cmpRead("Target "+id, func(d *DB) (any, error) { return d.Target(ctx, id) })
		cmpRead("ListSubsystems of "+id, func(d *DB) (any, error) {
			return collectErr(func(p Page) ([]*nvmegate.Subsystem, string, error) {
				return d.ListSubsystems(ctx, SubsystemFilter{TargetID: id}, p)
			})
		})
		cmpRead("ListSubsystems of acme on "+id, func(d *DB) (any, error) {
			return collectErr(func(p Page) ([]*nvmegate.Subsystem, string, error) {
				return d.ListSubsystems(ctx, SubsystemFilter{TargetID: id, Tenant: "acme"}, p)
			})
		})
	}
	for i, nqn := range w.subs {
		cmpRead("Subsystem "+nqn, func(d *DB) (any, error) { return d.Subsystem(ctx, nqn) })
		cmpRead("SubsystemGrants "+nqn, func(d *DB) (any, error) { return d.SubsystemGrants(ctx, nqn) })
		for _, f := range []NamespaceFilter{{SubsystemNQN: nqn}, {SubsystemNQN: nqn, Tenant: tenantOf(i)}, {SubsystemNQN: nqn, Tenant: "other"}, {SubsystemNQN: nqn, Region: "nowhere"}} {
			cmpRead(fmt.Sprintf("ListNamespaces %+v", f), func(d *DB) (any, error) {
				return collectErr(func(p Page) ([]*nvmegate.Namespace, string, error) { return d.ListNamespaces(ctx, f, p) })
			})
		}
		for nsid := range uint32(4) {
			cmpRead(fmt.Sprintf("Namespace %s/%d", nqn, nsid), func(d *DB) (any, error) { return d.Namespace(ctx, nqn, nsid) })
		}
	}
	for i, node := range w.nodes {
		cmpRead("HostBinding "+node, func(d *DB) (any, error) { return d.HostBinding(ctx, node) })
		cmpRead("HostBindingByNQN "+hostNQN(i), func(d *DB) (any, error) { return d.HostBindingByNQN(ctx, hostNQN(i)) })
		cmpRead("NodeActiveGrants "+node, func(d *DB) (any, error) { return d.NodeActiveGrants(ctx, node) })
		for _, job := range append(w.jobs, "none") {
			for _, sub := range w.subs {
				cmpRead("NodeGrants "+node+" "+job+" "+sub, func(d *DB) (any, error) { return d.NodeGrants(ctx, node, job, sub) })
			}
		}
	}
	for _, id := range append(w.jobs, "none") {
		cmpRead("Job "+id, func(d *DB) (any, error) { return d.Job(ctx, id) })
	}
	for _, id := range append(w.grants, "grant-none") {
		cmpRead("Grant "+id, func(d *DB) (any, error) { return d.Grant(ctx, id) })
	}
	cmpRead("ExpiredGrants", func(d *DB) (any, error) { return d.ExpiredGrants(ctx) })
	cmpRead("PendingRemovals", func(d *DB) (any, error) { return d.PendingRemovals(ctx) })

	// The same reads against the records in the file, without its indexes.
	must(t, db.bolt.View(func(tx *bolt.Tx) error {
		now := clock.Now()
		for _, id := range w.targets {
			got, gotErr := db.Target(ctx, id)
			want, wantErr := getTarget(tx, id)
			sameResult(t, "file: Target "+id, got, gotErr, want, wantErr)
		}
		for _, nqn := range w.subs {
			got, gotErr := db.Subsystem(ctx, nqn)
			want, wantErr := getSubsystem(tx, nqn)
			sameResult(t, "file: Subsystem "+nqn, got, gotErr, want, wantErr)
			for nsid := range uint32(4) {
				got, gotErr := db.Namespace(ctx, nqn, nsid)
				want, wantErr := getNamespace(tx, nqn, nsid)
				sameResult(t, "file: Namespace", got, gotErr, want, wantErr)
			}
		}
		for i, node := range w.nodes {
			got, gotErr := db.HostBinding(ctx, node)
			want, wantErr := getHostBinding(tx, node)
			sameResult(t, "file: HostBinding "+node, got, gotErr, want, wantErr)
			byNQN, err := db.HostBindingByNQN(ctx, hostNQN(i))
			if id := tx.Bucket(bucketHostBindingsByNQN).Get([]byte(hostNQN(i))); id == nil {
				wantError(t, err, nvmegate.ENOTFOUND, "")
			} else {
				want, wantErr := getHostBinding(tx, string(id))
				sameResult(t, "file: HostBindingByNQN", byNQN, err, want, wantErr)
			}
		}
		for _, id := range w.jobs {
			got, gotErr := db.Job(ctx, id)
			want, wantErr := getJob(tx, id)
			if wantErr == nil {
				db.expire(want)
			}
			sameResult(t, "file: Job "+id, got, gotErr, want, wantErr)
		}
		// Grants: what the indexes must say, from the records alone.
		var active, pending []*nvmegate.Grant
		must(t, tx.Bucket(bucketGrants).ForEach(func(k, v []byte) error {
			g, err := decodeGrant(v)
			must(t, err)
			if g.State == nvmegate.GrantActive {
				active = append(active, g)
			} else if g.RemovalPending {
				pending = append(pending, g)
			}
			got, err := db.Grant(ctx, string(k))
			shown := *g
			db.expireGrant(&shown)
			sameResult(t, "file: Grant "+string(k), got, err, &shown, nil)
			return nil
		}))
		where := func(keep func(*nvmegate.Grant) bool, order func(a, b *nvmegate.Grant) int) []*nvmegate.Grant {
			var out []*nvmegate.Grant
			for _, g := range active {
				if keep(g) {
					c := *g
					out = append(out, &c)
				}
			}
			slices.SortFunc(out, order)
			return out
		}
		byID := func(a, b *nvmegate.Grant) int { return cmp.Compare(a.ID, b.ID) }
		for _, sub := range w.subs {
			got, err := db.SubsystemGrants(ctx, sub)
			sameResult(t, "file: SubsystemGrants "+sub, got, err, where(func(g *nvmegate.Grant) bool { return g.SubsystemNQN == sub }, byID), nil)
		}
		for _, node := range w.nodes {
			got, err := db.NodeActiveGrants(ctx, node)
			want := where(func(g *nvmegate.Grant) bool { return g.Node == node }, func(a, b *nvmegate.Grant) int {
				return cmp.Or(cmp.Compare(a.JobID, b.JobID), cmp.Compare(a.SubsystemNQN, b.SubsystemNQN), cmp.Compare(a.ID, b.ID))
			})
			sameResult(t, "file: NodeActiveGrants "+node, got, err, want, nil)
		}
		got, err := db.ExpiredGrants(ctx)
		want := where(func(g *nvmegate.Grant) bool { return !now.Before(g.ExpiresAt) }, func(a, b *nvmegate.Grant) int {
			return cmp.Or(cmp.Compare(a.SubsystemNQN, b.SubsystemNQN), cmp.Compare(a.ID, b.ID))
		})
		sameResult(t, "file: ExpiredGrants", got, err, want, nil)
		got, err = db.PendingRemovals(ctx)
		if pending == nil {
			pending = []*nvmegate.Grant{}
		}
		sameResult(t, "file: PendingRemovals", got, err, pending, nil) // ForEach is in ID order
		return nil
	}))
}

// sameResult fails unless two reads returned equal values and errors.
func sameResult(t *testing.T, what string, got any, gotErr error, want any, wantErr error) {
	t.Helper()
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("%s: error %v, want %v", what, gotErr, wantErr)
	}
	if gotErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %s\nwant %s", what, show(got), show(want))
	}
}

func show(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Slice {
		s := "["
		for i := range rv.Len() {
			s += fmt.Sprintf("%+v ", rv.Index(i).Interface())
		}
		return s + "]"
	}
	return fmt.Sprintf("%+v", v)
}

// collectErr collects every page of a listing in pages of two.
func collectErr[T any](list func(Page) ([]T, string, error)) ([]T, error) {
	var all []T
	p := Page{Size: 2}
	for {
		items, next, err := list(p)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		p.Token = next
	}
}

// modelState is a deep copy of what the model holds, to compare before and
// after a write that must change nothing.
func modelState(t *testing.T, db *DB) (records, uint64) {
	t.Helper()
	var r records
	var rev uint64
	must(t, db.bolt.View(func(tx *bolt.Tx) error {
		var err error
		r, rev, err = load(tx)
		return err
	}))
	db.model.mu.RLock()
	defer db.model.mu.RUnlock()
	if !reflect.DeepEqual(db.model.records, r) || db.model.rev.Load() != rev {
		t.Fatalf("the model differs from the file")
	}
	return r, rev
}

func wantModel(t *testing.T, db *DB, r records, rev uint64) {
	t.Helper()
	db.model.mu.RLock()
	defer db.model.mu.RUnlock()
	if got := db.model.rev.Load(); got != rev {
		t.Errorf("revision %d, want %d", got, rev)
	}
	if !reflect.DeepEqual(db.model.records, r) {
		t.Errorf("the model changed")
	}
}

// A write that fails, in its function or at commit, leaves the model and
// the revision as they were; so does a group commit that fails and is
// retried one by one, but for the writes that then succeed.
func TestFailedWriteLeavesModel(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	inventory(t, db, "acme")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	ended := newGrant(9, subNQN(0))
	ended.State = nvmegate.GrantRevoked
	must(t, db.PutGrants(ctx, newGrant(1, subNQN(0)), ended))
	r, rev := modelState(t, db)

	t.Run("refused in the transaction", func(t *testing.T) {
		// The first grant is written (and recorded) before the second
		// is refused: the transaction rolls back, and its change with it.
		revived := *ended
		revived.State = nvmegate.GrantActive
		wantError(t, db.PutGrants(ctx, newGrant(2, subNQN(0)), &revived), nvmegate.ECONFLICT, "")
		wantModel(t, db, r, rev)
		_, err := db.Grant(ctx, newGrant(2, "").ID)
		wantError(t, err, nvmegate.ENOTFOUND, "")

		// Likewise any function error after something was recorded.
		boom := errors.New("boom")
		err = db.update(ctx, func(tx *txn) error {
			tx.record(op{target: newTarget("t9")})
			tx.record(op{grant: newGrant(3, subNQN(0))})
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatal(err)
		}
		wantModel(t, db, r, rev)
	})

	t.Run("commit fails", func(t *testing.T) {
		// bbolt refuses to grow the file past MaxSize at commit: the
		// job's record is written, recorded, and then not committed.
		st, err := os.Stat(db.bolt.Path())
		must(t, err)
		db.bolt.MaxSize = int(st.Size())
		j := newJob("job-big", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly})
		j.ExpiresAt = t0.Add(1000 * time.Hour)
		for i := range 20000 {
			j.Nodes = append(j.Nodes, nodeID(10+i))
		}
		err = db.CreateJob(ctx, j)
		if !errors.Is(err, berrors.ErrMaxSizeReached) {
			t.Fatalf("CreateJob past MaxSize: %v, want ErrMaxSizeReached", err)
		}
		wantModel(t, db, r, rev)
		_, err = db.Job(ctx, "job-big")
		wantError(t, err, nvmegate.ENOTFOUND, "")
		db.bolt.MaxSize = 0
		must(t, db.CreateJob(ctx, j))
		if got := db.Revision(); got != rev+1 {
			t.Fatalf("revision %d after the next commit, want %d", got, rev+1)
		}
		r, rev = modelState(t, db)
	})

	t.Run("group commit retried", func(t *testing.T) {
		// Many writes in flight so that groups form; the revived grant
		// fails its group, which is re-run one by one.
		const n = 32
		errs := make(chan error, n+1)
		start := make(chan struct{})
		for i := range n {
			go func() { <-start; errs <- db.PutGrant(ctx, newGrant(100+i, subNQN(0))) }()
		}
		go func() {
			<-start
			revived := *ended
			revived.State = nvmegate.GrantActive
			errs <- db.PutGrant(ctx, &revived)
		}()
		close(start)
		for range n + 1 {
			if err := <-errs; err != nil {
				wantError(t, err, nvmegate.ECONFLICT, "")
			}
		}
		got, rev2 := modelState(t, db) // the model matches the file
		if rev2 <= rev || rev2 > rev+n {
			t.Errorf("revision %d after %d grant writes from %d", rev2, n, rev)
		}
		if gs, _ := db.SubsystemGrants(ctx, subNQN(0)); len(gs) != n+1 || len(got.grants) != n+1 {
			t.Errorf("%d active grants, want %d", len(gs), n+1)
		}
		if g, _ := db.Grant(ctx, ended.ID); g.State != nvmegate.GrantRevoked {
			t.Errorf("the revoked grant came back: %s", g.State)
		}
	})
}

// The revision grows by one with each commit, not with a refused write,
// and is kept in the file across restarts.
func TestRevision(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "store.db")
	db := openPath(t, path)
	if got := db.Revision(); got != 0 {
		t.Fatalf("new store at revision %d", got)
	}
	want := uint64(0)
	write := func(err error, commits bool) {
		t.Helper()
		if commits {
			must(t, err)
			want++
		} else if err == nil {
			t.Fatal("write succeeded")
		}
		if got := db.Revision(); got != want {
			t.Fatalf("revision %d, want %d", got, want)
		}
	}
	write(db.CreateTarget(ctx, newTarget("t1")), true)
	write(db.CreateTarget(ctx, newTarget("t1")), false)    // EEXISTS in the transaction
	write(db.CreateTarget(ctx, &nvmegate.Target{}), false) // EINVALID before it
	write(db.CreateSubsystem(ctx, newSubsystem(subNQN(0), "t1", "acme")), true)
	write(db.PutGrants(ctx, newGrant(1, subNQN(0)), newGrant(2, subNQN(0))), true)  // one commit
	must(t, db.PutGrantsMoving(ctx, nil, []string{"grant-none"}, nil, HostEntry{})) // changes nothing: no revision
	if got := db.Revision(); got != want {
		t.Fatalf("a write that changed nothing moved the revision to %d from %d", got, want)
	}
	write(db.DeleteTarget(ctx, "t1"), false)
	must(t, db.Close())
	if err := db.CreateTarget(ctx, newTarget("t2")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}

	db = openPath(t, path)
	defer db.Close()
	if got := db.Revision(); got != want {
		t.Fatalf("reopened at revision %d, want %d", got, want)
	}
	write(db.DeleteSubsystem(ctx, subNQN(0)), true)
}

// Readers never see part of a commit: a grant superseded by another in one
// commit is never seen with it or without it, and grants moved to another
// host entry together are never seen with different entries.
func TestReadersSeeWholeCommits(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	node := nodeID(1)
	cur := newGrant(0, subNQN(0))
	cur.Node = node
	a, b := newGrant(1, subNQN(1)), newGrant(2, subNQN(2))
	a.Node, b.Node = node, node
	must(t, db.PutGrants(ctx, cur, a, b))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	fail := make(chan string, 4)
	for range 3 {
		wg.Go(func() {
			last := uint64(0)
			for {
				select {
				case <-stop:
					return
				default:
				}
				rev := db.Revision()
				if rev < last {
					fail <- fmt.Sprintf("revision went back from %d to %d", last, rev)
					return
				}
				last = rev
				gs, err := db.NodeActiveGrants(ctx, node)
				if err != nil {
					fail <- err.Error()
					return
				}
				var onSub0 int
				var entries []HostEntry
				for _, g := range gs {
					switch g.SubsystemNQN {
					case subNQN(0):
						onSub0++
					default:
						entries = append(entries, EntryOf(g))
					}
				}
				if onSub0 != 1 || len(entries) != 2 || entries[0] != entries[1] {
					fail <- fmt.Sprintf("saw %d grants on the superseded subsystem and entries %v", onSub0, entries)
					return
				}
				if sg, err := db.SubsystemGrants(ctx, subNQN(0)); err != nil || len(sg) != 1 {
					fail <- fmt.Sprintf("subsystem grants: %d, %v", len(sg), err)
					return
				}
			}
		})
	}
	for i := range 200 {
		next := newGrant(10+i, subNQN(0))
		next.Node = node
		cur.State = nvmegate.GrantReleased
		to := HostEntry{KeyVersion: uint64(2 + i), DHCHAPHash: "sha384", DHGroup: "ffdhe3072", Bidirectional: true}
		must(t, db.PutGrantsMoving(ctx, []*nvmegate.Grant{next, cur}, []string{a.ID, b.ID}, nil, to))
		cur = next
	}
	close(stop)
	wg.Wait()
	select {
	case msg := <-fail:
		t.Fatal(msg)
	default:
	}
}

// What a read returns is the caller's: changing it changes nothing in the
// store. A job's slices are shared (DB.Job): appending is safe.
func TestReadsReturnCopies(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	inventory(t, db, "acme")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	must(t, db.CreateHostBinding(ctx, newBinding(1, "acme")))
	must(t, db.CreateJob(ctx, newJob("job-1", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: "ro"})))
	must(t, db.PutGrant(ctx, newGrant(1, subNQN(0))))
	r, rev := modelState(t, db)

	tg, err := db.Target(ctx, "t1")
	must(t, err)
	tg.Ports[0].Address, tg.Region = "203.0.113.1", "elsewhere"
	s, err := db.Subsystem(ctx, subNQN(0))
	must(t, err)
	s.PortIDs[0], s.Tenant = 99, "globex"
	subs, _, err := db.ListSubsystems(ctx, SubsystemFilter{TargetID: "t1"}, Page{})
	must(t, err)
	subs[0].PortIDs[0] = 98
	n, err := db.Namespace(ctx, subNQN(0), 1)
	must(t, err)
	n.Tenant = "globex"
	ns, _, err := db.ListNamespaces(ctx, NamespaceFilter{SubsystemNQN: subNQN(0)}, Page{})
	must(t, err)
	ns[0].Region = "elsewhere"
	h, err := db.HostBindingByNQN(ctx, hostNQN(1))
	must(t, err)
	h.SPIFFEID = nodeID(2)
	j, err := db.Job(ctx, "job-1")
	must(t, err)
	j.State, j.Nodes, j.AllowedRegions = "finished", append(j.Nodes, nodeID(3)), append(j.AllowedRegions, "us-east")
	for _, read := range []func() ([]*nvmegate.Grant, error){
		func() ([]*nvmegate.Grant, error) { return db.SubsystemGrants(ctx, subNQN(0)) },
		func() ([]*nvmegate.Grant, error) { return db.NodeActiveGrants(ctx, nodeID(1)) },
		func() ([]*nvmegate.Grant, error) {
			g, err := db.Grant(ctx, "grant-0001")
			return []*nvmegate.Grant{g}, err
		},
	} {
		gs, err := read()
		must(t, err)
		gs[0].State, gs[0].KeyVersion = nvmegate.GrantRevoked, 7
	}
	wantModel(t, db, r, rev)
}

// The scope revision moves with inventory, bindings and jobs, not with
// grants: under a connect load (grants only) it stays put.
func TestScopeRevision(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "store.db")
	db := openPath(t, path)
	must(t, db.CreateTarget(ctx, newTarget("t1")))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(0), "t1", "acme")))
	inv := db.Revision()
	if got := db.ScopeRevision(); got != inv {
		t.Fatalf("scope revision %d after inventory changes, want %d", got, inv)
	}
	must(t, db.PutGrants(ctx, newGrant(1, subNQN(0))))
	must(t, db.PutGrants(ctx, newGrant(2, subNQN(0))))
	if db.Revision() != inv+2 || db.ScopeRevision() != inv {
		t.Fatalf("after two grant commits: revision %d (want %d), scope revision %d (want %d)", db.Revision(), inv+2, db.ScopeRevision(), inv)
	}
	must(t, db.CreateTarget(ctx, newTarget("t2")))
	if got := db.ScopeRevision(); got != db.Revision() {
		t.Fatalf("scope revision %d after a target was added, want %d", got, db.Revision())
	}
	must(t, db.Close())
	db = openPath(t, path)
	defer db.Close()
	if db.ScopeRevision() != db.Revision() {
		t.Fatalf("reopened: scope revision %d, revision %d", db.ScopeRevision(), db.Revision())
	}
}

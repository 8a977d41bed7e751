package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

// openJournaled opens the audit log and the store journaled in it, in
// dir, checkpointing every interval.
func openJournaled(fail func(...any), dir, storeFile string, interval time.Duration) (*audit.Log, *store.DB) {
	log, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/store"})
	if err != nil {
		fail(err)
	}
	db, err := store.Open(filepath.Join(dir, storeFile), store.Options{Journal: log, CheckpointInterval: interval})
	if err != nil {
		log.Close()
		fail(err)
	}
	return log, db
}

// journalInventory writes a target, a subsystem and its namespace, and
// returns the subsystem's NQN.
func journalInventory(fail func(...any), db *store.DB) string {
	ctx := context.Background()
	tg := &nvmegate.Target{ID: "t1", Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4, Address: "192.0.2.10", ServiceID: "4420"}}}
	sub := "nqn.2026-01.io.nvmegate:sub-0001"
	for _, err := range []error{
		db.CreateTarget(ctx, tg),
		db.CreateSubsystem(ctx, &nvmegate.Subsystem{NQN: sub, TargetID: "t1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}),
		db.CreateNamespace(ctx, &nvmegate.Namespace{SubsystemNQN: sub, NSID: 1, Tenant: "acme", Region: "eu-west", DataClass: nvmegate.ClassRestricted,
			Dataset: nvmegate.Dataset{Name: "common-crawl/2026-10", Digest: "sha256:" + strings.Repeat("ab", 32)}}),
	} {
		if err != nil {
			fail(err)
		}
	}
	return sub
}

// fillJournaled writes an inventory and n grants, one change each.
func fillJournaled(fail func(...any), db *store.DB, n int) {
	ctx := context.Background()
	sub := journalInventory(fail, db)
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	for i := range n {
		g := &nvmegate.Grant{ID: fmt.Sprintf("grant-%04d", i), JobID: "job-1", Tenant: "acme", Node: fmt.Sprintf("spiffe://example.org/node/n%04d", i%7),
			HostNQN: fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-4000-8000-%012x", i%7, i%7), SubsystemNQN: sub, KeyVersion: 1,
			IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), State: nvmegate.GrantActive, DecisionID: "d", DHCHAPHash: "sha384", DHGroup: "ffdhe3072"}
		if _, err := db.OpenGrant(ctx, g, nil, true, nil); err != nil {
			fail(err)
		}
	}
}

// The journal's child: fill, print the digest, and exit without closing
// anything — what kill -9 leaves (the checkpoint is an hour away, so the
// file holds none of the changes).
func TestMain(m *testing.M) {
	if dir := os.Getenv("NVMEGATE_JOURNAL_CHILD"); dir != "" {
		fail := func(args ...any) { fmt.Println(append([]any{"error"}, args...)...); os.Exit(2) }
		_, db := openJournaled(fail, dir, "store.db", time.Hour)
		fillJournaled(fail, db, 40)
		rev, digest, err := db.StateDigest(context.Background())
		if err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Println(rev, digest)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A journaled store that exits without a checkpoint loses nothing: the
// restart replays the journal's changes and reaches the digest the store
// had; and a fresh store replayed from the whole journal reaches it too.
func TestJournalReplaysWhatTheFileLacks(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "NVMEGATE_JOURNAL_CHILD="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var rev uint64
	var want string
	if _, err := fmt.Sscan(strings.TrimSpace(string(out)), &rev, &want); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	if rev != 43 {
		t.Fatalf("child at revision %d, want 43 (3 inventory changes and 40 grants)", rev)
	}
	log, db := openJournaled(t.Fatal, dir, "store.db", time.Hour)
	defer log.Close()
	gotRev, got, err := db.StateDigest(context.Background())
	if err != nil || gotRev != rev || got != want {
		t.Fatalf("after the restart: revision %d digest %s (%v); want %d %s", gotRev, got, err, rev, want)
	}
	active, err := db.ActiveGrants(context.Background())
	if err != nil || len(active) != 7 {
		t.Fatalf("active grants after replay: %d (%v), want 7 (one per node; each connect superseded the one before)", len(active), err)
	}
	mustJ(t, db.Close())

	fresh, err := store.Open(filepath.Join(dir, "fresh.db"), store.Options{Journal: log})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if r, d, err := fresh.StateDigest(context.Background()); err != nil || r != rev || d != want {
		t.Fatalf("fresh replay: revision %d digest %s (%v); want %d %s", r, d, err, rev, want)
	}
}

// A store whose journal ends before the store's revision (an older log
// put back, a log from elsewhere) is refused: the projection would claim
// changes the log does not hold.
func TestJournalOlderThanTheStoreRefused(t *testing.T) {
	dir := t.TempDir()
	log, db := openJournaled(t.Fatal, dir, "store.db", time.Hour)
	fillJournaled(t.Fatal, db, 3)
	mustJ(t, db.Close())
	mustJ(t, log.Close())
	// A second log whose changes end at revision 1.
	other := t.TempDir()
	olog, odb := openJournaled(t.Fatal, other, "store.db", time.Hour)
	mustJ(t, odb.CreateTarget(context.Background(), &nvmegate.Target{ID: "t9", Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4, Address: "192.0.2.10", ServiceID: "4420"}}}))
	mustJ(t, odb.Close())
	_, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: olog})
	if err == nil || !strings.Contains(err.Error(), "older than the store") {
		t.Fatalf("Open with an older journal = %v, want refused", err)
	}
	olog.Close()
}

func mustJ(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An index key written by one change is found by the next while both are
// in the open transaction (an empty value stored as nil read as absent
// there): a release's pending removal is settled by the next change.
func TestJournalSettlesInTheOpenTransaction(t *testing.T) {
	log, db := openJournaled(t.Fatal, t.TempDir(), "store.db", time.Hour)
	defer log.Close()
	defer db.Close()
	fillJournaled(t.Fatal, db, 1)
	ctx := context.Background()
	gs, err := db.ActiveGrants(ctx)
	if err != nil || len(gs) != 1 {
		t.Fatalf("active grants %v, %v", gs, err)
	}
	g := gs[0]
	g.State, g.RemovalPending = nvmegate.GrantReleased, true
	mustJ(t, db.PutGrants(ctx, g))
	if n := db.PendingRemovalCount(); n != 1 {
		t.Fatalf("%d removals pending after the release, want 1", n)
	}
	mustJ(t, db.SettleRemovals(ctx, []string{g.ID}))
	if n := db.PendingRemovalCount(); n != 0 {
		t.Fatalf("%d removals pending after the settlement, want 0", n)
	}
	if p, err := db.PendingRemovals(ctx); err != nil || len(p) != 0 {
		t.Fatalf("pending removals %v, %v", p, err)
	}
}

// A write proposed after the store closed is refused, and the file
// closes: no transaction is opened behind Close's back.
func TestJournalWriteAfterCloseRefused(t *testing.T) {
	log, db := openJournaled(t.Fatal, t.TempDir(), "store.db", time.Hour)
	defer log.Close()
	fillJournaled(t.Fatal, db, 1)
	mustJ(t, db.Close())
	err := db.CreateTarget(context.Background(), &nvmegate.Target{ID: "t2", Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4, Address: "192.0.2.11", ServiceID: "4420"}}})
	if !errors.Is(err, store.ErrClosed) {
		t.Fatalf("a write after Close = %v, want ErrClosed", err)
	}
}

// A store that recorded no changes before (one that ran unjournaled: an
// upgrade) is not restarted: its state becomes the journal's genesis
// snapshot, recorded once, and a replay from nothing — the snapshot, then
// the changes — reaches the store's digest.
func TestJournalGenesisOfAnOlderStore(t *testing.T) {
	dir := t.TempDir()
	plain, err := store.Open(filepath.Join(dir, "store.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fillJournaled(t.Fatal, plain, 5) // unjournaled: revisions 1–8 are in no log
	mustJ(t, plain.Close())

	log, db := openJournaled(t.Fatal, dir, "store.db", time.Hour)
	defer log.Close()
	ctx := context.Background()
	snaps := 0
	if _, err := log.Snapshot(func(rev, _ uint64, _ []byte) error {
		snaps++
		if rev != 8 {
			t.Errorf("genesis at revision %d, want 8", rev)
		}
		return nil
	}); err != nil || snaps != 1 {
		t.Fatalf("snapshots %d, %v", snaps, err)
	}
	gs, err := db.ActiveGrants(ctx)
	if err != nil || len(gs) != 5 {
		t.Fatalf("active grants %d, %v", len(gs), err)
	}
	g := gs[0]
	g.State, g.RemovalPending = nvmegate.GrantReleased, false
	mustJ(t, db.PutGrants(ctx, g)) // revision 9, journaled
	rev, want, err := db.StateDigest(ctx)
	if err != nil || rev != 9 {
		t.Fatalf("revision %d, %v", rev, err)
	}
	mustJ(t, db.Close())

	// Reopened: no second genesis.
	db2, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: log})
	if err != nil {
		t.Fatal(err)
	}
	mustJ(t, db2.Close())
	recs, _, err := log.Query(ctx, audit.Filter{Kinds: []audit.EventKind{audit.EventStateSnapshot}}, audit.Page{})
	if err != nil || len(recs) != 1 || recs[0].Entry.Change == nil || recs[0].Entry.Change.Revision != 8 {
		t.Fatalf("snapshot entries %+v, %v", recs, err)
	}

	fresh, err := store.Open(filepath.Join(dir, "fresh.db"), store.Options{Journal: log})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if r, d, err := fresh.StateDigest(ctx); err != nil || r != rev || d != want {
		t.Fatalf("replay from the genesis: revision %d digest %s (%v); want %d %s", r, d, err, rev, want)
	}
}

// A write that changes nothing makes no revision and no entry, and a
// second Close is harmless.
func TestJournalNoChangeNoRevision(t *testing.T) {
	log, db := openJournaled(t.Fatal, t.TempDir(), "store.db", time.Hour)
	defer log.Close()
	fillJournaled(t.Fatal, db, 1)
	rev, size := db.Revision(), log.Size()
	mustJ(t, db.SettleRemovals(context.Background(), []string{"grant-0000"})) // not pending: nothing to settle
	if db.Revision() != rev || log.Size() != size {
		t.Fatalf("a write that changed nothing: revision %d→%d, log %d→%d entries", rev, db.Revision(), size, log.Size())
	}
	mustJ(t, db.Close())
	mustJ(t, db.Close())
}

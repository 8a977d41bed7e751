package store

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

func TestPersistence(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "store.db")
	db := openPath(t, path)
	must(t, db.CreateTarget(ctx, newTarget("t1")))
	sub := newSubsystem(subNQN(1), "t1", "acme")
	must(t, db.CreateSubsystem(ctx, sub))
	ns := newNamespace(subNQN(1), 4, "acme")
	must(t, db.CreateNamespace(ctx, ns))
	hb := newBinding(1, "acme")
	must(t, db.CreateHostBinding(ctx, hb))
	must(t, db.Close())

	db = openPath(t, path)
	defer db.Close()
	if err := checkInvariants(db); err != nil {
		t.Fatal(err)
	}
	gotSub, err := db.Subsystem(ctx, subNQN(1))
	must(t, err)
	gotNS, err := db.Namespace(ctx, subNQN(1), 4)
	must(t, err)
	gotHB, err := db.HostBindingByNQN(ctx, hostNQN(1))
	must(t, err)
	for _, c := range []struct{ got, want any }{{gotSub, sub}, {gotNS, ns}, {gotHB, hb}} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("after reopen: %+v\nwant %+v", c.got, c.want)
		}
	}
	// The rules hold across the reopen: the indexes were persisted too.
	wantError(t, db.CreateHostBinding(ctx, &nvmegate.HostBinding{SPIFFEID: nodeID(2), HostNQN: hostNQN(1)}), nvmegate.ECONFLICT, "")
	wantError(t, db.DeleteTarget(ctx, "t1"), nvmegate.ECONFLICT, "")
	wantError(t, db.CreateNamespace(ctx, newNamespace(subNQN(1), 5, "globex")), nvmegate.EINVALID, "tenant")
}

func TestOpenFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	db := openPath(t, path)
	defer db.Close()
	fi, err := os.Stat(path)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	db := openPath(t, path)
	defer db.Close()

	const timeout = 200 * time.Millisecond
	start := time.Now()
	db2, err := Open(path, Options{Timeout: timeout})
	elapsed := time.Since(start)
	if err == nil {
		db2.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("error = %v, want ErrLocked", err)
	}
	wantMessage(t, err, path, "locked", timeout.String())
	// bbolt retries every 50ms and gives up one retry before the deadline.
	if elapsed > timeout+time.Second {
		t.Errorf("gave up after %v, timeout %v", elapsed, timeout)
	}

	// Released on Close.
	must(t, db.Close())
	db2, err = Open(path, Options{Timeout: timeout})
	must(t, err)
	must(t, db2.Close())
}

func TestOpenOptions(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "store.db"), Options{Timeout: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("negative timeout: %v", err)
	}
	// Zero options work: real clock, default timeout.
	db, err := Open(filepath.Join(t.TempDir(), "store.db"), Options{})
	must(t, err)
	defer db.Close()
	tg := newTarget("t1")
	before := time.Now()
	must(t, db.CreateTarget(context.Background(), tg))
	if tg.CreatedAt.Before(before.Add(-time.Second)) || tg.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("CreatedAt %v is not now", tg.CreatedAt)
	}
}

// setMeta rewrites a meta key of a closed store file.
func setMeta(t *testing.T, path string, key, value []byte) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, nil)
	must(t, err)
	defer bdb.Close()
	must(t, bdb.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(key, value) }))
}

func TestOpenNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	must(t, openPath(t, path).Close())
	setMeta(t, path, metaSchema, binary.BigEndian.AppendUint64(nil, SchemaVersion+1))

	db, err := Open(path, Options{})
	if err == nil {
		db.Close()
		t.Fatal("opened a file with a newer schema")
	}
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("error = %v, want ErrSchemaTooNew", err)
	}
	wantMessage(t, err, path, "version 2", "up to 1", "newer nvmegate")
	// Refusing released the lock.
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 100 * time.Millisecond})
	must(t, err)
	bdb.Close()

	setMeta(t, path, metaSchema, []byte{1})
	if _, err := Open(path, Options{}); err == nil || !strings.Contains(err.Error(), "corrupt schema version") {
		t.Errorf("short schema version: %v", err)
	}
}

func TestOpenForeignFile(t *testing.T) {
	dir := t.TempDir()

	// A bbolt file of another component: left untouched.
	path := filepath.Join(dir, "audit.db")
	bdb, err := bolt.Open(path, 0o600, nil)
	must(t, err)
	must(t, bdb.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("leaves")); return err }))
	must(t, bdb.Close())
	if _, err := Open(path, Options{}); !errors.Is(err, ErrNotStore) {
		t.Errorf("bbolt file without meta: %v, want ErrNotStore", err)
	}
	bdb, err = bolt.Open(path, 0o600, nil)
	must(t, err)
	must(t, bdb.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketTargets) != nil {
			t.Error("Open added buckets to a foreign file")
		}
		return nil
	}))
	must(t, bdb.Close())

	// A meta bucket of another kind.
	path = filepath.Join(dir, "keys.db")
	must(t, openPath(t, path).Close())
	setMeta(t, path, metaKind, []byte("nvmegate/keys"))
	if _, err := Open(path, Options{}); !errors.Is(err, ErrNotStore) {
		t.Errorf("other kind: %v, want ErrNotStore", err)
	}

	// Not a bbolt file at all.
	path = filepath.Join(dir, "junk.db")
	must(t, os.WriteFile(path, []byte(strings.Repeat("junk", 4096)), 0o600))
	if db, err := Open(path, Options{}); err == nil {
		db.Close()
		t.Error("opened a junk file")
	}
}

func TestContextCanceled(t *testing.T) {
	db := openTestDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := db.CreateTarget(ctx, newTarget("t1")); !errors.Is(err, context.Canceled) {
		t.Errorf("CreateTarget: %v, want context.Canceled", err)
	}
	if _, err := db.Target(ctx, "t1"); !errors.Is(err, context.Canceled) {
		t.Errorf("Target: %v, want context.Canceled", err)
	}
	if _, _, err := db.ListNamespaces(ctx, NamespaceFilter{}, Page{}); !errors.Is(err, context.Canceled) {
		t.Errorf("ListNamespaces: %v, want context.Canceled", err)
	}
	if _, err := db.Target(context.Background(), "t1"); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		t.Errorf("canceled create wrote: %v", err)
	}
}

func TestClosed(t *testing.T) {
	db := openPath(t, filepath.Join(t.TempDir(), "store.db"))
	must(t, db.Close())
	must(t, db.Close()) // idempotent
	ctx := context.Background()
	if err := db.CreateTarget(ctx, newTarget("t1")); !errors.Is(err, ErrClosed) {
		t.Errorf("CreateTarget after Close: %v, want ErrClosed", err)
	}
	if _, err := db.HostBindingByNQN(ctx, hostNQN(1)); !errors.Is(err, ErrClosed) {
		t.Errorf("HostBindingByNQN after Close: %v, want ErrClosed", err)
	}
}

// TestCorruptRecord overwrites stored bytes: reads fail with an internal
// error (never a half-decoded record, never a caller's error code).
func TestCorruptRecord(t *testing.T) {
	ctx := context.Background()
	db := openPath(t, filepath.Join(t.TempDir(), "store.db"))
	defer db.Close()
	must(t, db.CreateTarget(ctx, newTarget("t1")))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(1), "t1", "acme")))
	for name, value := range map[string][]byte{
		"truncated JSON": []byte(`{"v":1,"nqn":"`),
		"future record":  []byte(`{"v":2,"nqn":"x"}`),
	} {
		tamper(t, db, func(tx *bolt.Tx) error {
			return tx.Bucket(bucketSubsystems).Put([]byte(subNQN(1)), value)
		})
		s, err := db.Subsystem(ctx, subNQN(1))
		if s != nil || nvmegate.ErrorCode(err) != nvmegate.EINTERNAL {
			t.Errorf("%s: Subsystem = %v, %v; want an internal error", name, s, err)
		}
		wantMessage(t, err, "decode subsystem")
		for _, f := range []SubsystemFilter{{}, {TargetID: "t1"}} { // from the file, from the model
			if _, _, err := db.ListSubsystems(ctx, f, Page{}); nvmegate.ErrorCode(err) != nvmegate.EINTERNAL {
				t.Errorf("%s: ListSubsystems %+v: %v, want an internal error", name, f, err)
			}
		}
		// A rule that reads the record fails closed too.
		if err := db.CreateNamespace(ctx, newNamespace(subNQN(1), 1, "acme")); nvmegate.ErrorCode(err) != nvmegate.EINTERNAL {
			t.Errorf("%s: CreateNamespace: %v, want an internal error", name, err)
		}
	}
}

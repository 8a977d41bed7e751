package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// t0 is in a non-UTC zone on purpose: the store must stamp CreatedAt in UTC.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("CET", 3600))

// fakeClock advances one second per reading, so records get distinct times.
type fakeClock struct{ n atomic.Int64 }

func (c *fakeClock) Now() time.Time {
	return t0.Add(time.Duration(c.n.Add(1)) * time.Second)
}

// openTestDB opens a store in a fresh temporary directory. When the test
// ends it checks the invariants of the file, then closes it.
func openTestDB(tb testing.TB) *DB {
	tb.Helper()
	db := openPath(tb, filepath.Join(tb.TempDir(), "store.db"))
	tb.Cleanup(func() {
		if err := db.Close(); err != nil {
			tb.Errorf("close: %v", err)
		}
	})
	tb.Cleanup(func() {
		if err := checkInvariants(db); err != nil {
			tb.Errorf("store invariants broken after test:\n%v", err)
		}
	})
	return db
}

// openPath opens the store at path with a fake clock and no cleanup.
func openPath(tb testing.TB, path string) *DB {
	tb.Helper()
	db, err := Open(path, Options{Now: new(fakeClock).Now})
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	return db
}

// noSync turns off fsync for bulk set-up; durability is not what such a
// test or benchmark measures.
func noSync(db *DB) { db.bolt.NoSync = true }

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// wantError fails unless err is an *nvmegate.Error with code and field.
func wantError(tb testing.TB, err error, code, field string) *nvmegate.Error {
	tb.Helper()
	var e *nvmegate.Error
	if !errors.As(err, &e) {
		tb.Fatalf("error = %v (%T), want *nvmegate.Error with code %s", err, err, code)
	}
	if e.Code != code || e.Field != field {
		tb.Fatalf("error = {code %s, field %q, %q}, want code %s, field %q", e.Code, e.Field, e.Message, code, field)
	}
	return e
}

// wantMessage fails unless the message of err contains each of subs.
func wantMessage(tb testing.TB, err error, subs ...string) {
	tb.Helper()
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			tb.Errorf("error %q does not contain %q", err, s)
		}
	}
}

// Fixtures. Each returns a valid record.

func newTarget(id string) *nvmegate.Target {
	return &nvmegate.Target{
		ID: id, Fabric: "fab-a", Region: "eu-west", Rack: "r1", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{
			{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4, Address: "192.0.2.10", ServiceID: "4420"},
			{ID: 2, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4, Address: "192.0.2.10", ServiceID: "4421", SecureChannel: nvmegate.SecureChannelRequired},
			{ID: 3, Transport: nvmegate.TransportRDMA, AddressFamily: nvmegate.FamilyIPv6, Address: "2001:db8::10", ServiceID: "4420"},
		},
	}
}

func subNQN(i int) string { return fmt.Sprintf("nqn.2026-01.io.nvmegate:sub-%04d", i) }

func newSubsystem(nqn, target, tenant string) *nvmegate.Subsystem {
	return &nvmegate.Subsystem{
		NQN: nqn, TargetID: target, Tenant: tenant, PortIDs: []uint16{1, 3},
		DHCHAP: true, Description: "training data",
	}
}

func newNamespace(nqn string, nsid uint32, tenant string) *nvmegate.Namespace {
	return &nvmegate.Namespace{
		SubsystemNQN: nqn, NSID: nsid, Tenant: tenant, Region: "eu-west",
		DataClass: nvmegate.ClassRestricted,
		Dataset:   nvmegate.Dataset{Name: "common-crawl/2026-10", Digest: "sha256:" + strings.Repeat("ab", 32)},
		QoS:       nvmegate.QoS{MaxIOPS: 1 << 40, MaxMBps: 5000},
	}
}

func nodeID(i int) string { return fmt.Sprintf("spiffe://example.org/node/n%04d", i) }

func hostNQN(i int) string {
	return fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-4000-8000-%012x", i, i)
}

func newBinding(i int, tenant string) *nvmegate.HostBinding {
	return &nvmegate.HostBinding{SPIFFEID: nodeID(i), HostNQN: hostNQN(i), Tenant: tenant}
}

// checkCreatedAt checks that Create stamped a UTC time from the clock and
// clears it so that the rest of the record can be compared with DeepEqual.
func checkCreatedAt(tb testing.TB, got *time.Time) {
	tb.Helper()
	if got.IsZero() || got.Before(t0) || got.Location() != time.UTC {
		tb.Errorf("CreatedAt = %v, want a UTC time from the test clock", *got)
	}
	*got = time.Time{}
}

// tamper changes the file behind the store's back, as damage or another
// program would, and reloads the model from it as Open would: the model
// follows the store's own writes only.
func tamper(tb testing.TB, db *DB, fn func(*bolt.Tx) error) {
	tb.Helper()
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	must(tb, db.bolt.Update(fn))
	must(tb, db.bolt.View(func(tx *bolt.Tx) error {
		recs, rev, err := load(tx)
		if err != nil {
			return err
		}
		db.model.mu.Lock()
		defer db.model.mu.Unlock()
		db.model.records = recs
		db.model.rev.Store(rev)
		return nil
	}))
}

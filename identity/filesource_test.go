package identity_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// svidFiles is one SVID's file set in a directory, as devca writes it.
type svidFiles struct{ cert, key, bundle string }

func writeSVIDFiles(t *testing.T, dir, name string, svid *x509svid.SVID) svidFiles {
	t.Helper()
	if err := devca.WriteSVID(dir, name, svid); err != nil {
		t.Fatal(err)
	}
	return svidFiles{
		cert:   filepath.Join(dir, name+".pem"),
		key:    filepath.Join(dir, name+".key"),
		bundle: filepath.Join(dir, "bundle.pem"),
	}
}

func newFileSource(t *testing.T, f svidFiles, log *slog.Logger) *identity.FileSource {
	t.Helper()
	src, err := identity.NewFileSource(f.cert, f.key, f.bundle, identity.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestFileSource_Rotation replaces the server's and then the client's files
// while connections are open: new connections use the new SVIDs, existing
// ones keep working. No sleeps: every handshake re-stats the files.
func TestFileSource_Rotation(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, td)
	if err := devca.WriteBundle(filepath.Join(dir, "bundle.pem"), ca.Bundle()); err != nil {
		t.Fatal(err)
	}
	server1, client1 := issue(t, ca, "/gateway"), issue(t, ca, "/node/h1")
	serverSrc := newFileSource(t, writeSVIDFiles(t, dir, "server", server1), discard())
	clientSrc := newFileSource(t, writeSVIDFiles(t, dir, "client", client1), discard())

	addr, rec := startServer(t, identity.ServerCredentials(serverSrc, td))
	creds := identity.ClientCredentials(clientSrc, tlsconfig.AuthorizeID(server1.ID))

	conn1 := dial(t, addr, creds)
	if got := serverSerial(t, conn1); got.Cmp(serial(server1)) != 0 {
		t.Fatalf("conn1 server serial %x, want %x", got, serial(server1))
	}
	if got := rec.last(t).serial; got.Cmp(serial(client1)) != 0 {
		t.Fatalf("server saw client serial %x, want %x", got, serial(client1))
	}

	// Rotate the server's SVID.
	server2 := issue(t, ca, "/gateway")
	writeSVIDFiles(t, dir, "server", server2)
	conn2 := dial(t, addr, creds)
	if got := serverSerial(t, conn2); got.Cmp(serial(server2)) != 0 {
		t.Fatalf("new connection: server serial %x, want rotated %x", got, serial(server2))
	}
	if got := serverSerial(t, conn1); got.Cmp(serial(server1)) != 0 {
		t.Fatalf("old connection: server serial %x, want %x", got, serial(server1))
	}

	// Rotate the client's SVID.
	client2 := issue(t, ca, "/node/h1")
	writeSVIDFiles(t, dir, "client", client2)
	conn3 := dial(t, addr, creds)
	serverSerial(t, conn3)
	if got := rec.last(t); got.serial.Cmp(serial(client2)) != 0 || got.id != client2.ID {
		t.Fatalf("new connection: server saw client %v serial %x, want rotated %x", got.id, got.serial, serial(client2))
	}
	serverSerial(t, conn1)
	if got := rec.last(t).serial; got.Cmp(serial(client1)) != 0 {
		t.Fatalf("old connection: server saw client serial %x, want %x", got, serial(client1))
	}
}

// TestFileSource_KeepsLastGood feeds broken file sets to a FileSource: it
// keeps serving the last good SVID or bundle, warns once per change without
// leaking key material, and recovers when good files arrive.
func TestFileSource_KeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, td)
	bundlePath := filepath.Join(dir, "bundle.pem")
	if err := devca.WriteBundle(bundlePath, ca.Bundle()); err != nil {
		t.Fatal(err)
	}
	svid1 := issue(t, ca, "/node/h1")
	f := writeSVIDFiles(t, dir, "node", svid1)
	var logs syncBuffer
	src := newFileSource(t, f, slog.New(slog.NewTextHandler(&logs, nil)))

	var keys [][]byte // every key PEM written in this test
	marshal := func(svid *x509svid.SVID) (cert, key []byte) {
		cert, key, err := svid.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
		return cert, key
	}
	marshal(svid1)
	warnings := func() int { return strings.Count(logs.String(), "level=WARN") }
	wantServing := func(step string, want *x509svid.SVID, wantWarnings int) {
		t.Helper()
		for range 2 { // a second look must not warn again
			got, err := src.GetX509SVID()
			if err != nil {
				t.Fatalf("%s: GetX509SVID: %v", step, err)
			}
			if serial(got).Cmp(serial(want)) != 0 {
				t.Fatalf("%s: serving serial %x, want %x", step, serial(got), serial(want))
			}
		}
		if n := warnings(); n != wantWarnings {
			t.Fatalf("%s: %d warnings, want %d; log:\n%s", step, n, wantWarnings, logs.String())
		}
	}
	wantServing("initial", svid1, 0)

	svid2, svid3 := issue(t, ca, "/node/h1"), issue(t, ca, "/node/h1")
	cert2, key2 := marshal(svid2)
	cert3, key3 := marshal(svid3)
	evilCert, evilKey := marshal(issue(t, newCA(t, evilTD), "/node/h1"))

	writeAtomic(t, f.cert, []byte("-----BEGIN CERTIFICATE-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE-----\n"))
	wantServing("garbage PEM", svid1, 1)

	writeAtomic(t, f.cert, cert2[:len(cert2)/2])
	wantServing("half-written chain", svid1, 2)

	writeAtomic(t, f.cert, cert2)
	writeAtomic(t, f.key, key3)
	wantServing("mismatched key", svid1, 3)
	if !strings.Contains(logs.String(), "does not match private key") {
		t.Errorf("mismatch warning does not say why; log:\n%s", logs.String())
	}

	writeAtomic(t, f.cert, evilCert)
	writeAtomic(t, f.key, evilKey)
	wantServing("other trust domain", svid1, 4)

	// Recovery: the writer's second file lands.
	writeAtomic(t, f.cert, cert2)
	writeAtomic(t, f.key, key2)
	wantServing("good set", svid2, 4)

	// An in-place rewrite (no rename, same inode) is seen too when the
	// size differs; the extra newline makes sure it does.
	if err := os.WriteFile(f.cert, append(cert3, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.key, key3, 0o600); err != nil {
		t.Fatal(err)
	}
	wantServing("in-place rewrite", svid3, 4)

	// Bundle: broken replacements keep the previous bundle.
	other := newCA(t, td)
	for i, data := range [][]byte{nil, []byte("not PEM at all")} {
		writeAtomic(t, bundlePath, data)
		b, err := src.GetX509BundleForTrustDomain(td)
		if err != nil || !b.Equal(ca.Bundle()) {
			t.Fatalf("broken bundle %d: got %v, %v; want the previous bundle", i, b, err)
		}
		if n := warnings(); n != 5+i {
			t.Fatalf("broken bundle %d: %d warnings, want %d", i, n, 5+i)
		}
	}
	both := x509bundle.FromX509Authorities(td, append(ca.Bundle().X509Authorities(), other.Bundle().X509Authorities()...))
	if err := devca.WriteBundle(bundlePath, both); err != nil {
		t.Fatal(err)
	}
	if b, err := src.GetX509BundleForTrustDomain(td); err != nil || !b.Equal(both) {
		t.Fatalf("rotated bundle not picked up: %v", err)
	}

	_, err := src.GetX509BundleForTrustDomain(evilTD)
	if !errors.Is(err, identity.ErrUnknownTrustDomain) {
		t.Errorf("bundle for a foreign trust domain: err = %v, want ErrUnknownTrustDomain", err)
	}

	log := logs.String()
	if strings.Contains(log, "PRIVATE KEY") {
		t.Errorf("log contains a PEM private key:\n%s", log)
	}
	for _, k := range keys {
		body := strings.Split(string(k), "\n")[1] // first base64 line
		if strings.Contains(log, body) {
			t.Errorf("log contains key material:\n%s", log)
		}
	}
}

func TestNewFileSource_FailsOnBadInitialFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, td)
	good := writeSVIDFiles(t, dir, "good", issue(t, ca, "/node/h1"))
	other := writeSVIDFiles(t, dir, "other", issue(t, ca, "/node/h2"))
	if err := devca.WriteBundle(good.bundle, ca.Bundle()); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	otherKey, _ := os.ReadFile(other.key)

	for name, f := range map[string]svidFiles{
		"missing chain":  {filepath.Join(dir, "nope.pem"), good.key, good.bundle},
		"missing bundle": {good.cert, good.key, filepath.Join(dir, "nope.pem")},
		"mismatched key": {good.cert, other.key, good.bundle},
		"key as chain":   {good.key, good.key, good.bundle},
		"empty bundle":   {good.cert, good.key, empty},
		"garbage bundle": {good.cert, good.key, good.key},
	} {
		_, err := identity.NewFileSource(f.cert, f.key, f.bundle, identity.WithLogger(discard()))
		if err == nil {
			t.Errorf("%s: NewFileSource succeeded", name)
			continue
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), strings.Split(string(otherKey), "\n")[1]) {
			t.Errorf("%s: error leaks key material: %v", name, err)
		}
	}

	src, err := identity.NewFileSource(good.cert, good.key, good.bundle)
	if err != nil {
		t.Fatal(err)
	}
	if src.TrustDomain() != td {
		t.Errorf("TrustDomain() = %v", src.TrustDomain())
	}
}

// BenchmarkFileSource_GetX509SVID measures the per-handshake cost of the
// stat-on-access check when nothing changed.
func BenchmarkFileSource_GetX509SVID(b *testing.B) {
	dir := b.TempDir()
	ca, _ := devca.New(td, time.Now())
	svid, _ := ca.Issue(spiffeid.RequireFromPath(td, "/node/h1"), time.Now(), time.Now().Add(time.Hour))
	if err := devca.WriteSVID(dir, "node", svid); err != nil {
		b.Fatal(err)
	}
	if err := devca.WriteBundle(filepath.Join(dir, "bundle.pem"), ca.Bundle()); err != nil {
		b.Fatal(err)
	}
	src, err := identity.NewFileSource(filepath.Join(dir, "node.pem"), filepath.Join(dir, "node.key"), filepath.Join(dir, "bundle.pem"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := src.GetX509SVID(); err != nil {
			b.Fatal(err)
		}
	}
}

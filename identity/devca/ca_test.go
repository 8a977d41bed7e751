package devca_test

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

var (
	td  = spiffeid.RequireTrustDomainFromString("nvmegate.test")
	now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
)

func newCA(t *testing.T) *devca.CA {
	t.Helper()
	ca, err := devca.New(td, now)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestNew_Root(t *testing.T) {
	ca := newCA(t)
	root := ca.Certificate()
	if !root.IsCA || root.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("root: IsCA=%v KeyUsage=%v", root.IsCA, root.KeyUsage)
	}
	if len(root.URIs) != 1 || root.URIs[0].String() != "spiffe://nvmegate.test" {
		t.Errorf("root URI SANs = %v", root.URIs)
	}
	if !root.NotBefore.Before(now) || root.NotAfter.Before(now.AddDate(9, 0, 0)) {
		t.Errorf("root validity %v .. %v", root.NotBefore, root.NotAfter)
	}
	if err := root.CheckSignatureFrom(root); err != nil {
		t.Errorf("root is not self-signed: %v", err)
	}
	if ca.TrustDomain() != td || ca.Bundle().TrustDomain() != td {
		t.Errorf("trust domain mismatch")
	}
	if _, err := devca.New(spiffeid.TrustDomain{}, now); err == nil {
		t.Error("New accepted an empty trust domain")
	}
}

func TestIssue_VerifiesAgainstBundle(t *testing.T) {
	ca := newCA(t)
	id := spiffeid.RequireFromString("spiffe://nvmegate.test/node/h1")
	svid, err := ca.Issue(id, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got, chains, err := x509svid.Verify(svid.Certificates, ca.Bundle(), x509svid.WithTime(now))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if got != id || svid.ID != id || len(chains) != 1 {
		t.Errorf("Verify = %v (svid.ID %v), %d chains", got, svid.ID, len(chains))
	}

	leaf := svid.Certificates[0]
	if len(svid.Certificates) != 1 {
		t.Errorf("chain has %d certificates, want the leaf only", len(svid.Certificates))
	}
	if leaf.IsCA || leaf.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("leaf IsCA=%v KeyUsage=%v", leaf.IsCA, leaf.KeyUsage)
	}
	if len(leaf.ExtKeyUsage) != 2 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || leaf.ExtKeyUsage[1] != x509.ExtKeyUsageClientAuth {
		t.Errorf("leaf ExtKeyUsage = %v", leaf.ExtKeyUsage)
	}
	if len(leaf.URIs) != 1 || len(leaf.DNSNames) != 0 || len(leaf.IPAddresses) != 0 {
		t.Errorf("leaf SANs: URIs %v DNS %v IP %v", leaf.URIs, leaf.DNSNames, leaf.IPAddresses)
	}
	if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 128 {
		t.Errorf("serial %v", leaf.SerialNumber)
	}

	// Verification uses the validity the caller chose.
	if _, _, err := x509svid.Verify(svid.Certificates, ca.Bundle(), x509svid.WithTime(now.Add(2*time.Hour))); err == nil {
		t.Error("SVID verified after notAfter")
	}
	// Another CA of the same trust domain does not verify it.
	if _, _, err := x509svid.Verify(svid.Certificates, newCA(t).Bundle(), x509svid.WithTime(now)); err == nil {
		t.Error("SVID verified against an unrelated CA")
	}

	// Every SVID has a fresh key and serial.
	other, err := ca.Issue(id, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if other.Certificates[0].SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Error("two SVIDs share a serial")
	}
	if other.PrivateKey.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(svid.PrivateKey.Public()) {
		t.Error("two SVIDs share a key")
	}
}

func TestIssue_Expired(t *testing.T) {
	ca := newCA(t)
	id := spiffeid.RequireFromString("spiffe://nvmegate.test/node/old")
	svid, err := ca.Issue(id, now.Add(-2*time.Hour+time.Minute), now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, ca.Bundle(), x509svid.WithTime(now)); err == nil {
		t.Error("expired SVID verified")
	}
}

func TestIssue_Refused(t *testing.T) {
	ca := newCA(t)
	_, err := ca.Issue(spiffeid.RequireFromString("spiffe://evil.test/node/h1"), now, now.Add(time.Hour))
	if !errors.Is(err, devca.ErrForeignTrustDomain) {
		t.Errorf("foreign trust domain: err = %v, want ErrForeignTrustDomain", err)
	}
	for name, tc := range map[string]struct {
		id     spiffeid.ID
		nb, na time.Time
	}{
		"zero id":       {spiffeid.ID{}, now, now.Add(time.Hour)},
		"no path":       {td.ID(), now, now.Add(time.Hour)},
		"empty period":  {spiffeid.RequireFromPath(td, "/x"), now, now},
		"beyond the CA": {spiffeid.RequireFromPath(td, "/x"), now, now.AddDate(20, 0, 0)},
	} {
		if _, err := ca.Issue(tc.id, tc.nb, tc.na); err == nil {
			t.Errorf("%s: Issue succeeded", name)
		}
	}
}

func TestSaveLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "td")
	ca := newCA(t)
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	checkMode(t, filepath.Join(dir, devca.CACertFile), 0o644)
	checkMode(t, filepath.Join(dir, devca.CAKeyFile), 0o600)
	checkNoTempFiles(t, dir)

	loaded, err := devca.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.TrustDomain() != td || !loaded.Certificate().Equal(ca.Certificate()) || !loaded.Bundle().Equal(ca.Bundle()) {
		t.Fatal("loaded CA differs from the saved one")
	}
	// The loaded key is the saved key: its SVIDs verify against the original bundle.
	svid, err := loaded.Issue(spiffeid.RequireFromPath(td, "/node/h1"), now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, ca.Bundle(), x509svid.WithTime(now.Add(time.Minute))); err != nil {
		t.Errorf("SVID from loaded CA does not verify: %v", err)
	}
}

func TestLoad_Invalid(t *testing.T) {
	dir := t.TempDir()
	if err := newCA(t).Save(dir); err != nil {
		t.Fatal(err)
	}
	// Pair ca.pem with the key of another CA.
	otherDir := t.TempDir()
	if err := newCA(t).Save(otherDir); err != nil {
		t.Fatal(err)
	}
	otherKey, err := os.ReadFile(filepath.Join(otherDir, devca.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, devca.CAKeyFile), otherKey, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = devca.Load(dir)
	if !errors.Is(err, devca.ErrInvalidCA) {
		t.Fatalf("mismatched key: err = %v, want ErrInvalidCA", err)
	}
	if strings.Contains(err.Error(), "PRIVATE KEY") || bytes.Contains([]byte(err.Error()), otherKey) {
		t.Errorf("error leaks key material: %v", err)
	}

	if err := os.WriteFile(filepath.Join(dir, devca.CACertFile), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := devca.Load(dir); !errors.Is(err, devca.ErrInvalidCA) {
		t.Errorf("garbage cert: err = %v, want ErrInvalidCA", err)
	}
	if _, err := devca.Load(t.TempDir()); err == nil {
		t.Error("Load of an empty directory succeeded")
	}
}

func TestWriteSVIDAndBundle(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	id := spiffeid.RequireFromPath(td, "/node/h1")
	svid, err := ca.Issue(id, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := devca.WriteSVID(dir, "node", svid); err != nil {
		t.Fatal(err)
	}
	bundlePath := filepath.Join(dir, "bundle.pem")
	if err := devca.WriteBundle(bundlePath, ca.Bundle()); err != nil {
		t.Fatal(err)
	}
	checkMode(t, filepath.Join(dir, "node.pem"), 0o644)
	checkMode(t, filepath.Join(dir, "node.key"), 0o600)
	checkMode(t, bundlePath, 0o644)
	checkNoTempFiles(t, dir)

	loaded, err := x509svid.Load(filepath.Join(dir, "node.pem"), filepath.Join(dir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	if loaded.ID != id || !loaded.Certificates[0].Equal(svid.Certificates[0]) {
		t.Error("loaded SVID differs")
	}
	bundle, err := x509bundle.Load(td, bundlePath)
	if err != nil {
		t.Fatal(err)
	}
	if !bundle.Equal(ca.Bundle()) {
		t.Error("loaded bundle differs")
	}

	// Rewriting replaces the file with a new inode (what FileSource relies on).
	before, _ := os.Stat(filepath.Join(dir, "node.pem"))
	if err := devca.WriteSVID(dir, "node", svid); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(filepath.Join(dir, "node.pem"))
	if os.SameFile(before, after) {
		t.Error("WriteSVID rewrote the file in place")
	}

	for _, name := range []string{"", ".", "..", "a/b", "../x"} {
		if err := devca.WriteSVID(dir, name, svid); err == nil {
			t.Errorf("WriteSVID accepted name %q", name)
		}
	}
	if err := devca.WriteBundle(bundlePath, x509bundle.New(td)); err == nil {
		t.Error("WriteBundle accepted an empty bundle")
	}
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %v, want %v", filepath.Base(path), got, want)
	}
}

func checkNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

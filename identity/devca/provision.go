package devca

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The dev trust domain directory, shared by `nvmegated dev` and the CLI's
// --dev-dir/--dev-identity shortcut:
//
//	DIR/ca/ca.pem, ca.key     the CA (created once, reused)
//	DIR/bundle.pem            the trust bundle
//	DIR/svid/NAME.pem, .key   one SVID per identity (reissued at each start)
//	DIR/gateway.json          the running gateway's addresses (ready file)
//	DIR/state/                the gateway's state
const (
	DevTrustDomain = "nvmegate.test"
	SVIDLifetime   = 24 * time.Hour
)

// Identity is one workload of the dev trust domain.
type Identity struct {
	Name string // file name and --dev-identity value
	Path string // SPIFFE ID path, following DESIGN §3
}

// DevIdentities are the workloads `nvmegated dev` issues SVIDs for: the
// gateway, an admin, an auditor, a scheduler and nodes (three of acme, two of
// globex) in each of the tenants acme and globex, and the agents of the demo's two targets.
var DevIdentities = []Identity{
	{"gateway", "/gateway/nvmegated"},
	{"admin", "/admin/ops"},
	{"auditor", "/auditor/audit"},
	{"acme-scheduler", "/tenant/acme/scheduler/slurm"},
	{"acme-node-1", "/node/acme-gpu-1"},
	{"acme-node-2", "/node/acme-gpu-2"},
	{"acme-node-3", "/node/acme-gpu-3"},
	{"globex-scheduler", "/tenant/globex/scheduler/slurm"},
	{"globex-node-1", "/node/globex-gpu-1"},
	{"globex-node-2", "/node/globex-gpu-2"},
	{"target-stor-eu-1", "/target/stor-eu-1"},
	{"target-stor-us-1", "/target/stor-us-1"},
}

// BundlePath is the trust bundle file of a dev directory.
func BundlePath(dir string) string { return filepath.Join(dir, "bundle.pem") }

// SVIDPaths are the certificate and key files of identity name.
func SVIDPaths(dir, name string) (cert, key string) {
	return filepath.Join(dir, "svid", name+".pem"), filepath.Join(dir, "svid", name+".key")
}

// ReadyPath is where a dev gateway writes its addresses.
func ReadyPath(dir string) string { return filepath.Join(dir, "gateway.json") }

// StatePath is the dev gateway's state directory.
func StatePath(dir string) string { return filepath.Join(dir, "state") }

// Provision makes dir a dev trust domain: it loads the CA from dir/ca or
// creates one, writes the bundle, and issues a fresh SVID (valid from
// now-1m for SVIDLifetime) for every identity in ids.
func Provision(dir string, ids []Identity, now time.Time) error {
	td := spiffeid.RequireTrustDomainFromString(DevTrustDomain)
	caDir := filepath.Join(dir, "ca")
	ca, err := Load(caDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if ca, err = New(td, now); err != nil {
			return err
		}
		if err := ca.Save(caDir); err != nil {
			return err
		}
	case err != nil:
		return err
	case ca.TrustDomain() != td:
		return fmt.Errorf("devca: %s holds a CA for %s, not %s", caDir, ca.TrustDomain(), td)
	}
	if err := WriteBundle(BundlePath(dir), ca.Bundle()); err != nil {
		return err
	}
	svidDir := filepath.Join(dir, "svid")
	if err := os.MkdirAll(svidDir, 0o700); err != nil {
		return fmt.Errorf("devca: %w", err)
	}
	for _, ident := range ids {
		id, err := spiffeid.FromPath(td, ident.Path)
		if err != nil {
			return fmt.Errorf("devca: identity %s: %w", ident.Name, err)
		}
		svid, err := ca.Issue(id, now.Add(-time.Minute), now.Add(SVIDLifetime))
		if err != nil {
			return err
		}
		if err := WriteSVID(svidDir, ident.Name, svid); err != nil {
			return err
		}
	}
	return nil
}

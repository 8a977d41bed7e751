package identity

import (
	"context"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// NewWorkloadSource connects to the SPIFFE Workload API at socketAddr (for
// example "unix:///run/spire/agent/public/api.sock") and returns a Source
// that serves the SVID and bundles the agent pushes; SPIRE rotates both
// without further action. It blocks until the first SVID and bundles arrive
// or ctx is done. Close it to stop watching.
//
// A workload entitled to several SVIDs gets the one whose ID is spiffeID
// ("" takes the first the agent lists). If none has that ID the source has
// no SVID: GetX509SVID fails rather than hand out another identity.
func NewWorkloadSource(ctx context.Context, socketAddr, spiffeID string) (Source, error) {
	opts := []workloadapi.X509SourceOption{workloadapi.WithClientOptions(workloadapi.WithAddr(socketAddr))}
	if spiffeID != "" {
		opts = append(opts, workloadapi.WithDefaultX509SVIDPicker(func(svids []*x509svid.SVID) *x509svid.SVID {
			for _, s := range svids {
				if s.ID.String() == spiffeID {
					return s
				}
			}
			return nil
		}))
	}
	src, err := workloadapi.NewX509Source(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("identity: workload API at %s: %w", socketAddr, err)
	}
	if spiffeID != "" {
		if _, err := src.GetX509SVID(); err != nil {
			src.Close()
			return nil, fmt.Errorf("identity: workload API at %s offers no SVID %s", socketAddr, spiffeID)
		}
	}
	return src, nil
}

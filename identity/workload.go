package identity

import (
	"context"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// NewWorkloadSource connects to the SPIFFE Workload API at socketAddr (for
// example "unix:///run/spire/agent/public/api.sock") and returns a Source
// that serves the SVID and bundles the agent pushes; SPIRE rotates both
// without further action. It blocks until the first SVID and bundles arrive
// or ctx is done. Close it to stop watching.
func NewWorkloadSource(ctx context.Context, socketAddr string) (Source, error) {
	src, err := workloadapi.NewX509Source(ctx,
		workloadapi.WithClientOptions(workloadapi.WithAddr(socketAddr)))
	if err != nil {
		return nil, fmt.Errorf("identity: workload API at %s: %w", socketAddr, err)
	}
	return src, nil
}

package devca_test

import (
	"fmt"
	"time"

	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

func Example() {
	now := time.Now()
	ca, err := devca.New(spiffeid.RequireTrustDomainFromString("nvmegate.test"), now)
	if err != nil {
		panic(err)
	}
	node := spiffeid.RequireFromString("spiffe://nvmegate.test/node/gpu-017")
	svid, err := ca.Issue(node, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		panic(err)
	}
	id, _, err := x509svid.Verify(svid.Certificates, ca.Bundle())
	fmt.Println(id, err)
	// Output: spiffe://nvmegate.test/node/gpu-017 <nil>
}

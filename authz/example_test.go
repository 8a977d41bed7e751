package authz_test

import (
	"context"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate/authz"
)

func ExampleParseCaller() {
	for _, s := range []string{
		"spiffe://example.org/tenant/acme/scheduler/slurm",
		"spiffe://example.org/node/gpu-01",
		"spiffe://example.org/admin/alice/extra",
	} {
		c := authz.ParseCaller(spiffeid.RequireFromString(s))
		fmt.Printf("%s tenant=%q name=%q\n", c.Role, c.Tenant, c.Name)
	}
	// Output:
	// scheduler tenant="acme" name="slurm"
	// node tenant="" name="gpu-01"
	// unknown tenant="" name=""
}

func ExampleEngine_Authorize() {
	ctx := context.Background()
	e, err := authz.NewEngine(ctx, authz.Options{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org")})
	if err != nil {
		panic(err) // a broken policy never loads
	}
	for _, id := range []string{"spiffe://example.org/admin/alice", "spiffe://example.org/node/gpu-01"} {
		caller := authz.ParseCaller(spiffeid.RequireFromString(id))
		in := authz.NewInput(caller, "/nvmegate.v1.Inventory/AddTarget", "", nil)
		d, err := e.Authorize(ctx, in)
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allow, d.Reasons)
	}
	fmt.Println(e.Status().Source)
	// Output:
	// true [role admin may perform inventory.add_target]
	// false [no rule allows role node to perform inventory.add_target]
	// embedded
}

package store_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/store"
)

func Example() {
	dir, err := os.MkdirTemp("", "nvmegate-store")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := store.Open(filepath.Join(dir, "store.db"), store.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	err = db.CreateTarget(ctx, &nvmegate.Target{
		ID: "stor-01", Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{
			ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4,
			Address: "192.0.2.10", ServiceID: "4420", SecureChannel: nvmegate.SecureChannelRequired,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	const nqn = "nqn.2026-01.io.example:acme-datasets"
	err = db.CreateSubsystem(ctx, &nvmegate.Subsystem{
		NQN: nqn, TargetID: "stor-01", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true, TLS: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	ns := &nvmegate.Namespace{
		SubsystemNQN: nqn, NSID: 1, Tenant: "acme", Region: "eu-west", DataClass: nvmegate.ClassRestricted,
		Dataset: nvmegate.Dataset{Name: "common-crawl/2026-10", Digest: "sha256:" + fmt.Sprintf("%064x", 42)},
	}
	if err := db.CreateNamespace(ctx, ns); err != nil {
		log.Fatal(err)
	}

	// Another tenant's namespace in acme's subsystem is refused.
	other := *ns
	other.NSID, other.Tenant = 2, "globex"
	err = db.CreateNamespace(ctx, &other)
	fmt.Println(nvmegate.ErrorCode(err), err.(*nvmegate.Error).Field)

	// A subsystem with namespaces cannot be deleted.
	fmt.Println(db.DeleteSubsystem(ctx, nqn))

	list, next, err := db.ListNamespaces(ctx, store.NamespaceFilter{Tenant: "acme"}, store.Page{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(list), list[0].Dataset.Name, next == "")
	// Output:
	// invalid tenant
	// subsystem "nqn.2026-01.io.example:acme-datasets" still has 1 namespace (nsid 1); delete them first
	// 1 common-crawl/2026-10 true
}

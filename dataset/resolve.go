package dataset

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Want is a dataset a job asks for, by its inventory name.
type Want struct {
	Name string // the inventory's dataset name
	Mode string // nvmegate.ModeReadOnly or nvmegate.ModeReadWrite
}

// Lister is the part of the Inventory service Resolve reads
// (pb.InventoryClient is one).
type Lister interface {
	ListNamespaces(ctx context.Context, in *pb.ListNamespacesRequest, opts ...grpc.CallOption) (*pb.ListNamespacesResponse, error)
}

// UnknownError says a dataset is not in the tenant's inventory.
type UnknownError struct{ Name, Tenant string }

func (e UnknownError) Error() string {
	return fmt.Sprintf("dataset %s is not in tenant %s's inventory", e.Name, e.Tenant)
}

// Resolve finds the tenant's namespaces that hold each dataset, with the
// mode asked for it. A dataset with no namespace is an UnknownError.
func Resolve(ctx context.Context, inv Lister, tenant string, ds []Want) ([]*pb.JobNamespace, error) {
	want := map[string]pb.AccessMode{}
	for _, d := range ds {
		want[d.Name] = pb.AccessMode_ACCESS_MODE_READ_ONLY
		if d.Mode == nvmegate.ModeReadWrite {
			want[d.Name] = pb.AccessMode_ACCESS_MODE_READ_WRITE
		}
	}
	found := map[string]bool{}
	var out []*pb.JobNamespace
	req := &pb.ListNamespacesRequest{Tenant: tenant, PageSize: 1000}
	for {
		resp, err := inv.ListNamespaces(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, n := range resp.Namespaces {
			if mode, ok := want[n.GetDataset().GetName()]; ok {
				out = append(out, &pb.JobNamespace{SubsystemNqn: n.SubsystemNqn, Nsid: n.Nsid, Mode: mode})
				found[n.GetDataset().GetName()] = true
			}
		}
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	for _, d := range ds {
		if !found[d.Name] {
			return nil, UnknownError{Name: d.Name, Tenant: tenant}
		}
	}
	return out, nil
}

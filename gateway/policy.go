package gateway

import (
	"context"

	"github.com/nvmegate/nvmegate"

	"github.com/nvmegate/nvmegate/authz"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// PolicyInfo reports the loaded policy.
type PolicyInfo interface {
	Status() authz.Status
}

// policyService implements Policy.Status; Explain comes with the Policy issue.
type policyService struct {
	pb.UnimplementedPolicyServer
	info PolicyInfo
}

func (s *policyService) Status(context.Context, *pb.PolicyStatusRequest) (*pb.PolicyStatusResponse, error) {
	if s.info == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "no policy engine is configured")
	}
	st := s.info.Status()
	return &pb.PolicyStatusResponse{Revision: st.Revision, Source: st.Source, LoadedAt: ts(st.LoadedAt), Modules: st.Modules}, nil
}

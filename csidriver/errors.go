package csidriver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fromGateway turns the gateway's answer into the CSI call's: the codes
// both speak pass through with the gateway's message (a policy refusal
// keeps its reason), what the driver did wrong is Internal, and a gateway
// that did not answer is Unavailable, which the CO retries.
func fromGateway(what string, err error) error {
	if err == nil {
		return nil
	}
	// The gateway's own status, under whatever wrapped it on the way:
	// its message, not the chain's.
	var gs interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &gs) {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return status.Errorf(codes.DeadlineExceeded, "%s: %v", what, err)
		case errors.Is(err, context.Canceled):
			return status.Errorf(codes.Canceled, "%s: %v", what, err)
		}
		return status.Errorf(codes.Internal, "%s: %v", what, err)
	}
	st := gs.GRPCStatus()
	code := st.Code()
	switch code {
	case codes.PermissionDenied, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition,
		codes.InvalidArgument, codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted,
		codes.Aborted, codes.Canceled, codes.OutOfRange:
	case codes.Unauthenticated:
		code = codes.PermissionDenied
	default:
		code = codes.Internal
	}
	return status.Errorf(code, "%s: nvmegate: %s", what, st.Message())
}

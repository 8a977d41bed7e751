package gateway

import (
	"context"
	"errors"
	"log/slog"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
)

// codeOf maps domain error codes to gRPC codes. This is the only place the
// mapping lives (STYLE 7).
var codeOf = map[string]codes.Code{
	nvmegate.EINVALID:         codes.InvalidArgument,
	nvmegate.ENOTFOUND:        codes.NotFound,
	nvmegate.EEXISTS:          codes.AlreadyExists,
	nvmegate.ECONFLICT:        codes.FailedPrecondition,
	nvmegate.EPERMISSION:      codes.PermissionDenied,
	nvmegate.EUNAUTHENTICATED: codes.Unauthenticated,
	nvmegate.EUNAVAILABLE:     codes.Unavailable,
	nvmegate.EEXHAUSTED:       codes.ResourceExhausted,
	nvmegate.EUNIMPLEMENTED:   codes.Unimplemented,
	nvmegate.EINTERNAL:        codes.Internal,
}

// toStatus turns an error from the domain into a gRPC status error. Errors
// that are already gRPC statuses pass through; context errors keep their
// meaning; anything else is logged and answered as a bare Internal so that no
// internal detail reaches the caller.
func toStatus(ctx context.Context, log *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		// The disk is full: a failed commit changed nothing, and the call
		// may succeed once space is back (seen in the disk-full e2e test,
		// where a grant write failed this way after its audit entry).
		log.ErrorContext(ctx, "storage full", "method", method, "err", err)
		return status.Error(codes.Unavailable, "storage full: nothing was changed; retry later")
	}
	code := nvmegate.ErrorCode(err)
	c, ok := codeOf[code]
	if !ok || c == codes.Internal {
		log.ErrorContext(ctx, "internal error", "method", method, "err", err)
		return status.Error(codes.Internal, "internal error")
	}
	return status.Error(c, nvmegate.ErrorMessage(err))
}

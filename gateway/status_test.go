package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A write that failed because the disk is full is Unavailable (retry
// later), not Internal; the message says nothing was changed.
func TestToStatusDiskFull(t *testing.T) {
	err := fmt.Errorf("store: commit: %w", &os.PathError{Op: "write", Path: "/var/lib/nvmegate/store.db", Err: syscall.ENOSPC})
	st := status.Convert(toStatus(context.Background(), slog.New(slog.DiscardHandler), "/m", err))
	if st.Code() != codes.Unavailable || strings.Contains(st.Message(), "/var/lib") {
		t.Fatalf("disk full: %v %q", st.Code(), st.Message())
	}
	if st := status.Convert(toStatus(context.Background(), slog.New(slog.DiscardHandler), "/m", errors.New("boom"))); st.Code() != codes.Internal {
		t.Fatalf("other error: %v", st.Code())
	}
}

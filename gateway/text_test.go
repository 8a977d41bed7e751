package gateway_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// keyBody is base64 without '+', '/' and '=', so that a key made of it is
// also a syntactically valid job ID and NQN tail.
const keyBody = "QWxsIHRoYXQgZ2xpdHRlcnMgaXMgbm90IGdvbGQuLi4uLkAx"

// wantNoEcho fails if err's message repeats the key.
func wantNoEcho(t *testing.T, err error) {
	t.Helper()
	if msg := status.Convert(err).Message(); strings.Contains(msg, keyBody) || strings.Contains(strings.ToLower(msg), "dhhc-1:") ||
		strings.Contains(strings.ToLower(msg), "nvmetlskey-1:") {
		t.Fatalf("message repeats the key: %q", msg)
	}
}

// Free text and identifiers holding key material are refused where they
// are typed, InvalidArgument naming the field and saying why, without
// repeating the key; nothing is stored, so GetSubsystem has nothing to
// return and the inventory nothing to keep.
func TestKeyMaterialInRequests(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))

	sub := validSubsystem()
	sub.Nqn = subNQN + "-2"
	sub.Description = "bring-up: host secret DHHC-1:00:" + keyBody + ":"
	_, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub})
	wantCode(t, err, codes.InvalidArgument, "subsystem.description", "key material")
	wantNoEcho(t, err)
	_, err = inv.GetSubsystem(ctx, &pb.GetSubsystemRequest{Nqn: sub.Nqn})
	wantCode(t, err, codes.NotFound)

	sub.Description = "psk NVMeTLSkey-1:01:" + keyBody + ":"
	_, err = inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub})
	wantCode(t, err, codes.InvalidArgument, "subsystem.description", "key material")
	wantNoEcho(t, err)

	sub.Description = ""
	sub.Nqn = "nqn.2026-01.io.nvmegate.test:dhhc-1:00:" + keyBody + ":"
	_, err = inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub})
	wantCode(t, err, codes.InvalidArgument, "subsystem.nqn", "key material")
	wantNoEcho(t, err)

	list, err := inv.ListSubsystems(ctx, &pb.ListSubsystemsRequest{})
	if err != nil || len(list.Subsystems) != 1 || list.Subsystems[0].Nqn != subNQN {
		t.Fatalf("ListSubsystems = %v, %v", list, err)
	}

	// A job ID the syntax of job IDs allows, that is a key.
	_, err = pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("DHHC-1:00:"+keyBody+":"))
	wantCode(t, err, codes.InvalidArgument, "job_id", "key material")
	wantNoEcho(t, err)

	_, err = pb.NewKeysClient(g.client(t, admin)).Rotate(ctx, &pb.RotateRequest{SubsystemNqn: subNQN, Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT,
		Reason: "old one was NVMeTLSkey-1:01:" + keyBody + ":"})
	wantCode(t, err, codes.InvalidArgument, "reason", "key material")
	wantNoEcho(t, err)
}

// Invisible characters that would disguise a value in a CLI table or a
// log line are refused in free text and names alike, with the code point
// named in the message.
func TestInvisibleCharactersInRequests(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))

	sub := validSubsystem()
	sub.Nqn = subNQN + "-2"
	sub.Description = "acme \u202egniniart\u202c"
	_, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub})
	wantCode(t, err, codes.InvalidArgument, "subsystem.description", "U+202E")

	sub.Description = "line one\u2028line two"
	_, err = inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub})
	wantCode(t, err, codes.InvalidArgument, "subsystem.description", "U+2028")

	sub.Description = ""
	sub.Nqn = subNQN + "\u200b"
	_, err = inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub})
	wantCode(t, err, codes.InvalidArgument, "subsystem.nqn", "U+200B")

	_, err = inv.GetSubsystem(ctx, &pb.GetSubsystemRequest{Nqn: "\ufeff" + subNQN})
	wantCode(t, err, codes.InvalidArgument, "nqn", "U+FEFF")

	_, err = pb.NewJobsClient(g.client(t, sched)).Finish(ctx, &pb.FinishRequest{JobId: "job-1", Reason: "done\u0085forged: line"})
	wantCode(t, err, codes.InvalidArgument, "reason", "U+0085")

	// Default_Ignorable_Code_Point (issue 29): a Hangul filler, blank in
	// a description; an emoji's presentation selector in a reason.
	sub.Nqn = subNQN + "-2"
	sub.Description = "acme\u3164training"
	_, err = inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub})
	wantCode(t, err, codes.InvalidArgument, "subsystem.description", "U+3164")
	_, err = pb.NewJobsClient(g.client(t, sched)).Finish(ctx, &pb.FinishRequest{JobId: "job-1", Reason: "done \u2714\ufe0f"})
	wantCode(t, err, codes.InvalidArgument, "reason", "U+FE0F")

	// A candidate policy module named to read as another in a listing.
	_, err = pb.NewPolicyClient(g.client(t, admin)).Explain(ctx, &pb.ExplainRequest{InputJson: []byte(`{}`),
		CandidateModules: map[string]string{"allow-all\u202eoger.rego": "package x"}})
	wantCode(t, err, codes.InvalidArgument, "candidate_modules", "U+202E")
}

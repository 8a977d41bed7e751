package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// keyKind parses --kind.
func keyKind(s string) (pb.KeyKind, error) {
	switch s {
	case "":
		return pb.KeyKind_KEY_KIND_UNSPECIFIED, nil
	case "access-root":
		return pb.KeyKind_KEY_KIND_ACCESS_ROOT, nil
	case "data-key":
		return pb.KeyKind_KEY_KIND_DATA_KEY, nil
	}
	return 0, fmt.Errorf("--kind must be access-root or data-key, got %q", s)
}

func (a *app) keysRotateCmd() *cobra.Command {
	var (
		sub, reason string
		nsid        uint32
		reencrypt   bool
	)
	cmd := &cobra.Command{
		Use:   "rotate --subsystem NQN [--nsid N [--reencrypt]] [--reason TEXT]",
		Short: "Rotate a subsystem's access-credential root, or with --nsid a namespace's data key",
		Long: `Make a new version of a subsystem's access-credential root (the DH-HMAC-CHAP
secrets and TLS PSKs of its hosts derive from it), or with --nsid rotate the
namespace's key-encryption key and rewrap its data key. The previous root stays
valid for the gateway's grace period. Recorded in the audit log.

With --nsid and --reencrypt, rotate the data key itself: the namespace's target
agent re-encrypts it, offline, from the current data key to a new one; the
subsystem may have no active grant. The command returns once the target has
taken the namespace offline; "keys status" shows REENCRYPTING until the target
reports the end, when the old data key is destroyed and the namespace is
exported again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: sub, Reason: reason}
			if nsid != 0 {
				req.Kind, req.Nsid = pb.KeyKind_KEY_KIND_DATA_KEY, nsid
			}
			req.Reencrypt = reencrypt
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewKeysClient(c).Rotate(ctx, req)
				if err != nil {
					return err
				}
				return a.print(resp, keyHeader, keyRows(resp.Status))
			})
		},
	}
	cmd.Flags().StringVar(&sub, "subsystem", "", "subsystem NQN")
	cmd.Flags().Uint32Var(&nsid, "nsid", 0, "namespace ID: rotate its data key instead of the root")
	cmd.Flags().BoolVar(&reencrypt, "reencrypt", false, "with --nsid: rotate the data key itself by re-encrypting the namespace (offline)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	cmd.MarkFlagRequired("subsystem")
	return cmd
}

func (a *app) keysStatusCmd() *cobra.Command {
	var sub, kind string
	cmd := &cobra.Command{
		Use:   "status [--subsystem NQN] [--kind access-root|data-key]",
		Short: "Show key versions, ages, grace periods and the next scheduled rotation (never key material)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := keyKind(kind)
			if err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewKeysClient(c).Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: sub, Kind: k})
				if err != nil {
					return err
				}
				var rows [][]string
				for _, st := range resp.Keys {
					rows = append(rows, keyRows(st)...)
				}
				return a.print(resp, keyHeader, rows)
			})
		},
	}
	cmd.Flags().StringVar(&sub, "subsystem", "", "only this subsystem's keys")
	cmd.Flags().StringVar(&kind, "kind", "", "only access-root or data-key")
	return cmd
}

var keyHeader = []string{"KIND", "KEY", "VERSION", "CREATED", "AGE", "STATE", "FINGERPRINT"}

// keyRows is one row per version, newest first.
func keyRows(st *pb.KeyStatus) [][]string {
	kind, name := "access-root", st.SubsystemNqn
	if st.Kind == pb.KeyKind_KEY_KIND_DATA_KEY {
		kind, name = "data-key", st.SubsystemNqn+"/"+strconv.FormatUint(uint64(st.Nsid), 10)
	}
	var rows [][]string
	if st.DataKeyGeneration > 1 {
		name += " gen " + strconv.FormatUint(st.DataKeyGeneration, 10)
	}
	for _, v := range st.Versions {
		state := "current"
		if v.Version == st.CurrentVersion && st.NextRotation != nil {
			state = "current, rotates " + tsString(st.NextRotation)
		}
		if v.Version == st.CurrentVersion && st.ReencryptingTo != 0 {
			state += ", REENCRYPTING to gen " + strconv.FormatUint(st.ReencryptingTo, 10)
		}
		if v.SupersededAt != nil {
			state = "superseded"
			if v.ValidUntil != nil {
				if v.ValidUntil.AsTime().After(time.Now()) {
					state = "grace until " + tsString(v.ValidUntil)
				} else {
					state = "expired " + tsString(v.ValidUntil)
				}
			}
		}
		age := ""
		if v.CreatedAt != nil {
			age = time.Since(v.CreatedAt.AsTime()).Round(time.Second).String()
		}
		rows = append(rows, []string{kind, name, strconv.FormatUint(v.Version, 10), tsString(v.CreatedAt), age, state, dash(v.Fingerprint)})
	}
	return rows
}

func tsString(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

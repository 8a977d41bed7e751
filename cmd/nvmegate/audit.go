package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/term"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) auditCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read, prove, export and verify the signed audit log"}
	cmd.AddCommand(a.auditQueryCmd(), a.auditCheckpointCmd(), a.auditProofCmd(), a.auditExportCmd(), a.auditVerifyCmd(), a.auditReportCmd())
	return cmd
}

func (a *app) auditQueryCmd() *cobra.Command {
	var (
		req          pb.QueryRequest
		since, until string
		all          bool
	)
	cmd := &cobra.Command{
		Use:   "query [--job ID] [--tenant T] [--subsystem NQN [--nsid N]] [--since T] [--until T] [--kind K...]",
		Short: "List log entries by job, tenant, namespace, time and kind",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if req.Since, err = flagTime("since", since); err != nil {
				return err
			}
			if req.Until, err = flagTime("until", until); err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				var resp *pb.QueryResponse
				entries := []*pb.AuditEntry{}
				for {
					if resp, err = pb.NewAuditClient(c).Query(ctx, &req); err != nil {
						return err
					}
					entries = append(entries, resp.Entries...)
					if !all || resp.NextPageToken == "" {
						break
					}
					req.PageToken = resp.NextPageToken
				}
				resp.Entries = entries
				rows := make([][]string, 0, len(entries))
				for _, e := range entries {
					decision := "-"
					if e.DecisionId != "" {
						decision = map[bool]string{true: "allow ", false: "deny "}[e.Allow] + e.DecisionId
					}
					detail := ""
					if d, err := audit.DecodeEntry(e.Entry); err == nil {
						detail = d.Detail
					}
					rows = append(rows, []string{strconv.FormatUint(e.Index, 10), e.Time.AsTime().UTC().Format(time.RFC3339),
						e.Kind, e.Caller, dash(e.JobId), dash(e.Tenant), decision, detail})
				}
				return a.printPage(resp, []string{"INDEX", "TIME", "KIND", "CALLER", "JOB", "TENANT", "DECISION", "DETAIL"}, rows, resp.NextPageToken)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.JobId, "job", "", "only entries of this job")
	f.StringVar(&req.Tenant, "tenant", "", "only entries of this tenant")
	f.StringVar(&req.SubsystemNqn, "subsystem", "", "only entries touching this subsystem NQN")
	f.Uint32Var(&req.Nsid, "nsid", 0, "only entries touching this namespace of --subsystem")
	f.StringVar(&since, "since", "", "only entries at or after this RFC 3339 time")
	f.StringVar(&until, "until", "", "only entries before this RFC 3339 time")
	f.StringSliceVar(&req.Kinds, "kind", nil, "only these event kinds (grant, deny, invalid_argument, inventory_change, policy_load, ...)")
	f.Int32Var(&req.PageSize, "page-size", 0, "entries per page, 1-1000 (default 100)")
	f.StringVar(&req.PageToken, "page-token", "", "token of the page to get, from a previous query")
	f.BoolVar(&all, "all", false, "follow page tokens to the end")
	return cmd
}

func flagTime(name, v string) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, fmt.Errorf("--%s must be an RFC 3339 time like 2026-12-01T09:00:00Z, got %q", name, v)
	}
	return timestamppb.New(t), nil
}

func (a *app) auditCheckpointCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "checkpoint [--out FILE]",
		Short: "Get the latest signed checkpoint (a C2SP signed note), signing one if the log grew",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAuditClient(c).Checkpoint(ctx, &pb.CheckpointRequest{})
				if err != nil {
					return err
				}
				if out != "" {
					if err := os.WriteFile(out, resp.Checkpoint, 0o644); err != nil {
						return err
					}
				}
				if a.output == "json" {
					return a.print(resp, nil, nil)
				}
				_, err = a.stdout.Write(resp.Checkpoint)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "also write the checkpoint to FILE (to pass to verify --since later)")
	return cmd
}

// checkpointKeys loads --key files for checking what the gateway sends.
func checkpointKeys(files []string) ([]attest.PublicKey, error) {
	var keys []attest.PublicKey
	for _, f := range files {
		k, err := attest.LoadPublicKeyFile(f)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func (a *app) auditProofCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "proof",
		Short: "Get RFC 6962 inclusion and consistency proofs; with --key, check them against a signed checkpoint",
	}
	var (
		index, size uint64
		from, to    uint64
		keyFiles    []string
	)
	// verified fetches and opens the latest checkpoint with the keys, so a
	// proof is checked against a root the gateway signed.
	verified := func(ctx context.Context, c *grpc.ClientConn) (*audit.Checkpoint, error) {
		if len(keyFiles) == 0 {
			return nil, nil
		}
		keys, err := checkpointKeys(keyFiles)
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewAuditClient(c).Checkpoint(ctx, &pb.CheckpointRequest{})
		if err != nil {
			return nil, err
		}
		cp, _, err := audit.OpenCheckpoint(resp.Checkpoint, keys)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		return &cp, nil
	}
	inclusion := &cobra.Command{
		Use: "inclusion --index I [--tree-size N] [--key FILE]", Short: "Prove that entry I is in the tree", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				cp, err := verified(ctx, c)
				if err != nil {
					return err
				}
				if cp != nil && size == 0 {
					size = cp.Size
				}
				resp, err := pb.NewAuditClient(c).InclusionProof(ctx, &pb.InclusionProofRequest{Index: index, TreeSize: size})
				if err != nil {
					return err
				}
				if resp.Index != index {
					return fmt.Errorf("gateway answered a proof for entry %d, not %d", resp.Index, index)
				}
				status := "not checked (no --key)"
				if cp != nil {
					if resp.TreeSize != cp.Size {
						return fmt.Errorf("proof is for tree size %d; the signed checkpoint has %d", resp.TreeSize, cp.Size)
					}
					if err := proof.VerifyInclusion(rfc6962.DefaultHasher, resp.Index, resp.TreeSize, resp.LeafHash, resp.Hashes, cp.Hash[:]); err != nil {
						return fmt.Errorf("inclusion proof does not verify: %w", err)
					}
					status = "verified against the signed checkpoint"
				}
				return a.print(resp, []string{"INDEX", "TREE SIZE", "LEAF HASH", "HASHES", "PROOF"},
					[][]string{{strconv.FormatUint(resp.Index, 10), strconv.FormatUint(resp.TreeSize, 10),
						base64.StdEncoding.EncodeToString(resp.LeafHash), strconv.Itoa(len(resp.Hashes)), status}})
			})
		},
	}
	inclusion.Flags().Uint64Var(&index, "index", 0, "entry index")
	inclusion.Flags().Uint64Var(&size, "tree-size", 0, "tree size (default: the latest checkpoint's)")
	inclusion.Flags().StringSliceVar(&keyFiles, "key", nil, "public key file(s) of the log (v<N>.pem or .vkey)")
	inclusion.MarkFlagRequired("index")

	var sinceFile string
	consistency := &cobra.Command{
		Use:   "consistency (--from N | --since CHECKPOINT_FILE --key FILE) [--to M]",
		Short: "Prove that the log at tree size M extends tree size N; with --since and --key, check it against both signed checkpoints",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var old *audit.Checkpoint
			if sinceFile != "" {
				keys, err := checkpointKeys(keyFiles)
				if err != nil {
					return err
				}
				if len(keys) == 0 {
					return errors.New("--since needs --key to check the saved checkpoint's signature")
				}
				note, err := os.ReadFile(sinceFile)
				if err != nil {
					return err
				}
				c, _, err := audit.OpenCheckpoint(note, keys)
				if err != nil {
					return fmt.Errorf("saved checkpoint: %w", err)
				}
				old, from = &c, c.Size
			}
			if from == 0 {
				return errors.New("give --from N or --since CHECKPOINT_FILE")
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				cur, err := verified(ctx, c)
				if err != nil {
					return err
				}
				if cur != nil && to == 0 {
					to = cur.Size
				}
				resp, err := pb.NewAuditClient(c).ConsistencyProof(ctx, &pb.ConsistencyProofRequest{FromSize: from, ToSize: to})
				if err != nil {
					return err
				}
				status := "not checked (no --since and --key)"
				if old != nil && cur != nil {
					if resp.FromSize != old.Size || resp.ToSize != cur.Size {
						return fmt.Errorf("proof is for sizes %d→%d; the signed checkpoints have %d→%d", resp.FromSize, resp.ToSize, old.Size, cur.Size)
					}
					if err := proof.VerifyConsistency(rfc6962.DefaultHasher, old.Size, cur.Size, resp.Hashes, old.Hash[:], cur.Hash[:]); err != nil {
						return fmt.Errorf("the log does NOT extend the saved checkpoint (fork or rollback): %w", err)
					}
					status = "verified: the signed log extends the saved checkpoint"
				}
				return a.print(resp, []string{"FROM", "TO", "HASHES", "PROOF"},
					[][]string{{strconv.FormatUint(resp.FromSize, 10), strconv.FormatUint(resp.ToSize, 10), strconv.Itoa(len(resp.Hashes)), status}})
			})
		},
	}
	consistency.Flags().Uint64Var(&from, "from", 0, "smaller tree size")
	consistency.Flags().Uint64Var(&to, "to", 0, "larger tree size (default: the latest checkpoint's)")
	consistency.Flags().StringVar(&sinceFile, "since", "", "a checkpoint saved earlier (audit checkpoint --out): prove the log extends it")
	consistency.Flags().StringSliceVar(&keyFiles, "key", nil, "public key file(s) of the log (v<N>.pem or .vkey)")
	cmd.AddCommand(inclusion, consistency)
	return cmd
}

func (a *app) auditExportCmd() *cobra.Command {
	var (
		out  string
		size uint64
	)
	cmd := &cobra.Command{
		Use:   "export --out DIR [--tree-size N]",
		Short: "Export the log in the C2SP tlog-tiles layout with the public keys of every signing-key version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ents, err := os.ReadDir(out); err == nil && len(ents) > 0 {
				return fmt.Errorf("--out %s is not empty", out)
			}
			files, bytes, err := a.exportTo(cmd.Context(), out, size)
			if err != nil {
				return err
			}
			cp, err := audit.ParseCheckpoint(mustRead(filepath.Join(out, "checkpoint")))
			if err != nil {
				return fmt.Errorf("export has no valid checkpoint: %w", err)
			}
			if a.output == "json" {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"dir": out, "files": files, "bytes": bytes, "tree_size": cp.Size, "origin": cp.Origin})
			}
			_, err = fmt.Fprintf(a.stdout, "exported %s: tree size %d, %d files, %d bytes to %s\n", cp.Origin, cp.Size, files, bytes, out)
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write (created; must be empty)")
	cmd.Flags().Uint64Var(&size, "tree-size", 0, "tree size of a stored checkpoint (default: a fresh checkpoint)")
	cmd.MarkFlagRequired("out")
	return cmd
}

// exportTo streams the gateway's export of the log at tree size size (0: a
// fresh checkpoint) into dir.
func (a *app) exportTo(ctx context.Context, dir string, size uint64) (files, bytes int, err error) {
	// The export is slower than one RPC: no per-call deadline.
	conn, err := a.dial(ctx)
	if err != nil {
		return 0, 0, err
	}
	stream, err := pb.NewAuditClient(conn).Export(ctx, &pb.ExportRequest{TreeSize: size})
	if err != nil {
		return 0, 0, statusErr(err)
	}
	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return files, bytes, nil
		}
		if err != nil {
			return files, bytes, statusErr(err)
		}
		p, err := exportPath(dir, f.Path)
		if err != nil {
			return files, bytes, err
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return files, bytes, err
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			return files, bytes, err
		}
		files++
		bytes += len(f.Data)
	}
}

// exportPath places a file the gateway named inside dir, refusing names
// that would escape it.
func exportPath(dir, name string) (string, error) {
	clean := path.Clean(name)
	if name == "" || clean != name || path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(name, "\\") {
		return "", fmt.Errorf("gateway sent an export file with an unsafe path %q", name)
	}
	return filepath.Join(dir, filepath.FromSlash(clean)), nil
}

func mustRead(p string) []byte {
	b, _ := os.ReadFile(p)
	return b
}

func (a *app) auditVerifyCmd() *cobra.Command {
	var (
		keyFiles []string
		since    string
		db       string
	)
	cmd := &cobra.Command{
		Use:   "verify (DIR | --db FILE) --key FILE [--key FILE...] [--since CHECKPOINT_FILE]",
		Short: "Verify an export (or a log file) offline: entries, tiles, tree, checkpoints, signatures",
		Long: `Recompute everything from an export directory written by "audit export"
(or, with --db, from the gateway's bbolt log file) and check it against the
given public keys: every entry against its committed hash, every tile, the
tree against each signed checkpoint, each checkpoint's signature, and, with
--since, that the log extends a checkpoint you kept from before (no fork, no
rollback). Needs no gateway. Exits 0 only if everything holds; otherwise
prints each failure with its location and exits non-zero.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == (db != "") {
				return errors.New("give an export directory or --db FILE")
			}
			return cobra.MaximumNArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := checkpointKeys(keyFiles)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				return errors.New("--key is required: verification trusts only the keys you give")
			}
			var sinceNote []byte
			if since != "" {
				if sinceNote, err = os.ReadFile(since); err != nil {
					return err
				}
			}
			progress, finish := a.progress()
			var rep *audit.Report
			if db != "" {
				rep, err = audit.CheckFile(cmd.Context(), db, keys, sinceNote, progress)
			} else {
				rep, err = audit.Verify(cmd.Context(), args[0], keys, sinceNote, progress)
			}
			finish()
			if err != nil {
				return err
			}
			if a.output == "json" {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				a.printReport(rep)
			}
			if !rep.OK() {
				return fmt.Errorf("verification failed: %d failure(s)", len(rep.Failures)+rep.Omitted)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&keyFiles, "key", nil, "trusted public key file (v<N>.pem or v<N>.vkey from the export's keys); repeat for each version")
	cmd.Flags().StringVar(&since, "since", "", "a checkpoint you saved earlier (audit checkpoint --out) that the log must extend")
	cmd.Flags().StringVar(&db, "db", "", "verify the gateway's log file instead of an export")
	return cmd
}

// progress returns a progress callback drawing a bar on stderr when it is a
// terminal (nothing otherwise), and a function that clears it.
func (a *app) progress() (audit.ProgressFunc, func()) {
	f, ok := a.stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil, func() {}
	}
	var bar *progressbar.ProgressBar
	return func(done, total uint64) {
			if bar == nil {
				bar = progressbar.NewOptions64(int64(total), progressbar.OptionSetWriter(f),
					progressbar.OptionSetDescription("verifying entries"), progressbar.OptionShowCount(),
					progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
			}
			bar.Set64(int64(done))
		}, func() {
			if bar != nil {
				bar.Finish()
			}
		}
}

func (a *app) printReport(r *audit.Report) {
	w := a.stdout
	fmt.Fprintf(w, "origin:       %s\n", r.Origin)
	fmt.Fprintf(w, "tree size:    %d\n", r.TreeSize)
	fmt.Fprintf(w, "root hash:    %s\n", r.RootHash)
	for _, k := range r.SignedBy {
		fmt.Fprintf(w, "signed by:    %s key v%d %s\n", k.Algorithm, k.Version, k.KeyID)
	}
	fmt.Fprintf(w, "entries:      %d checked\n", r.Entries)
	fmt.Fprintf(w, "checkpoints:  %d checked\n", r.Checkpoints)
	if r.OK() {
		fmt.Fprintln(w, "result:       OK")
		return
	}
	fmt.Fprintf(w, "result:       FAILED (%d)\n", len(r.Failures)+r.Omitted)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  %s\n", f.Error())
	}
	if r.Omitted > 0 {
		fmt.Fprintf(w, "  ... and %d more\n", r.Omitted)
	}
}

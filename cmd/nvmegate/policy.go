package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) policyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Inspect and dry-run the gateway's Rego policy"}
	cmd.AddCommand(&cobra.Command{
		Use: "status", Short: "Show the loaded policy revision", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewPolicyClient(c).Status(ctx, &pb.PolicyStatusRequest{})
				if err != nil {
					return err
				}
				loaded := ""
				if resp.LoadedAt != nil {
					loaded = resp.LoadedAt.AsTime().Format("2006-01-02T15:04:05Z07:00")
				}
				return a.print(resp, []string{"REVISION", "SOURCE", "LOADED", "MODULES"},
					[][]string{{resp.Revision, resp.Source, loaded, strings.Join(resp.Modules, ",")}})
			})
		},
	})

	var input, candidate string
	explain := &cobra.Command{
		Use:   "explain --input FILE",
		Short: "Dry-run a policy input against the gateway's live policy (or a candidate) and print the decision",
		Long: `Send a policy input document (JSON, the schema of policy/README.md) to the
gateway, which evaluates it exactly as given against the live policy, or with
--candidate DIR against the live bundle with DIR's .rego modules added or
replaced, and prints the decision document: allow, reasons, obligations.
Nothing is acted on or stored.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := readInput(input)
			if err != nil {
				return err
			}
			req := &pb.ExplainRequest{InputJson: data}
			if candidate != "" {
				if req.CandidateModules, err = readModules(candidate); err != nil {
					return err
				}
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewPolicyClient(c).Explain(ctx, req)
				if err != nil {
					return err
				}
				d := resp.Decision
				return a.printDecision(verdict{d.GetAllow(), d.GetId(), d.GetPolicyRevision(), d.GetReasons()}, resp.DecisionJson)
			})
		},
	}
	explain.Flags().StringVar(&input, "input", "", `input document (JSON file, or "-" for stdin)`)
	explain.Flags().StringVar(&candidate, "candidate", "", "directory of candidate .rego modules")
	explain.MarkFlagRequired("input")
	cmd.AddCommand(explain, a.policyEvalCmd(), a.policyImpactCmd())
	return cmd
}

// policyImpactCmd shows what loading a candidate policy would do to the
// active grants, for a security team's review and its CI.
func (a *app) policyImpactCmd() *cobra.Command {
	var candidate string
	var failOnRevoke bool
	cmd := &cobra.Command{
		Use:   "impact --candidate DIR [--fail-on-revoke]",
		Short: "List the active grants a candidate policy would revoke or oblige to renew, without loading it",
		Long: `Send a candidate policy directory (its .rego modules, data.json and
selftest.json; tests are left out) to the gateway, which compiles and
self-tests it as a reload would and decides every active grant again under
it, exactly as a connect of the grant's node would be decided, without
loading it or changing anything. Prints each grant the candidate would revoke
(no longer allowed) or oblige to renew (allowed under stronger obligations),
with the reasons. --fail-on-revoke exits non-zero if any grant would be
revoked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			files, err := readPolicyDir(candidate)
			if err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				// 10,000 affected grants are a few MB, past gRPC's default 4 MB.
				resp, err := pb.NewPolicyClient(c).Impact(ctx, &pb.ImpactRequest{CandidateFiles: files}, grpc.MaxCallRecvMsgSize(maxComplianceBundle))
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Grants))
				revokes := 0
				for _, g := range resp.Grants {
					if g.Outcome == "revoke" {
						revokes++
					}
					rows = append(rows, []string{g.Outcome, g.GrantId, g.JobId, g.Node, g.SubsystemNqn, strings.Join(g.Reasons, "; ")})
				}
				if err := a.print(resp, []string{"OUTCOME", "GRANT", "JOB", "NODE", "SUBSYSTEM", "REASONS"}, rows); err != nil {
					return err
				}
				if a.output != "json" {
					fmt.Fprintf(a.stdout, "candidate %s (serving %s): %d active grants decided again, %d would be revoked, %d must renew\n",
						resp.CandidateRevision, resp.ServingRevision, resp.Checked, revokes, len(resp.Grants)-revokes)
				}
				if failOnRevoke && revokes > 0 {
					return fmt.Errorf("the candidate would revoke %d active grant(s) (--fail-on-revoke)", revokes)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&candidate, "candidate", "", "candidate policy directory")
	cmd.Flags().BoolVar(&failOnRevoke, "fail-on-revoke", false, "exit non-zero if the candidate would revoke any active grant")
	cmd.MarkFlagRequired("candidate")
	return cmd
}

// readPolicyDir reads a policy directory's files as a candidate, its Rego
// tests left out (the gateway does not load them).
func readPolicyDir(dir string) (map[string][]byte, error) {
	files := map[string][]byte{}
	err := fs.WalkDir(os.DirFS(dir), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasSuffix(p, "_test.rego") || !(strings.HasSuffix(p, ".rego") || strings.HasSuffix(p, ".json") || strings.HasSuffix(p, ".manifest")) {
			return nil
		}
		b, err := fs.ReadFile(os.DirFS(dir), p)
		files[p] = b
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("--candidate: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("--candidate: no policy files in %s", dir)
	}
	return files, nil
}

// verdict is what the gateway (or the offline engine) made of a decision
// document: after fail-closed checks, which can turn a malformed allow into
// a deny, so it is printed rather than the raw document's allow.
type verdict struct {
	Allow    bool
	ID       string
	Revision string
	Reasons  []string
}

// printDecision prints the verdict and the raw decision document: as one
// JSON object (-o json) or as a short summary.
func (a *app) printDecision(v verdict, raw []byte) error {
	doc := map[string]any{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &doc); err != nil {
			doc = map[string]any{"unparsed": string(raw)}
		}
	}
	if a.output == "json" {
		return writeJSON(a.stdout, map[string]any{
			"allow": v.Allow, "reasons": v.Reasons, "decision_id": v.ID, "policy_revision": v.Revision, "document": doc,
		})
	}
	word := "DENY"
	if v.Allow {
		word = "ALLOW"
	}
	fmt.Fprintf(a.stdout, "%s  (decision %s, policy %s)\n", word, v.ID, v.Revision)
	for _, r := range v.Reasons {
		fmt.Fprintf(a.stdout, "  - %s\n", r)
	}
	if ob, ok := doc["obligations"].(map[string]any); ok && len(ob) > 0 {
		b, _ := json.Marshal(ob)
		fmt.Fprintf(a.stdout, "  obligations: %s\n", b)
	}
	return nil
}

func readInput(path string) ([]byte, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("--input: %w", err)
	}
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("--input: not a JSON object: %w", err)
	}
	return data, nil
}

// readModules reads the .rego files of dir (not its tests) as candidate modules.
func readModules(dir string) (map[string]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.rego"))
	if err != nil {
		return nil, err
	}
	mods := map[string]string{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		mods[filepath.Base(p)] = string(b)
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("--candidate: no .rego modules in %s", dir)
	}
	return mods, nil
}

// policyEvalCmd evaluates an input offline, with a policy directory on disk:
// for authors writing Rego before it reaches a gateway.
func (a *app) policyEvalCmd() *cobra.Command {
	var dir, input, dataFile string
	cmd := &cobra.Command{
		Use:   "eval --policy DIR --input FILE [--data FILE]",
		Short: "Evaluate a policy input offline against a policy directory and print the decision",
		Long: `Load a policy directory (.rego modules, data.json files, selftest.json) as the
gateway would — compiled, self-tested — and evaluate one input document exactly
as given. --data merges a JSON file into the data document (at its root), on
top of the directory's data.json files. Needs no gateway and no identity.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := readInput(input)
			if err != nil {
				return err
			}
			var in map[string]any
			if err := json.Unmarshal(raw, &in); err != nil {
				return err
			}
			b, err := loadPolicyDir(dir, dataFile)
			if err != nil {
				return err
			}
			td := "example.org"
			if gw, ok := in["gateway"].(map[string]any); ok {
				if s, ok := gw["trust_domain"].(string); ok && s != "" {
					td = s
				}
			}
			eng, err := newOfflineEngine(cmd.Context(), b, dir, td)
			if err != nil {
				return err
			}
			d, doc, err := eng.Explain(cmd.Context(), in, nil)
			if err != nil {
				return err
			}
			return a.printDecision(verdict{d.Allow, d.ID, d.PolicyRevision, d.Reasons}, doc)
		},
	}
	cmd.Flags().StringVar(&dir, "policy", "", "policy directory")
	cmd.Flags().StringVar(&input, "input", "", `input document (JSON file, or "-" for stdin)`)
	cmd.Flags().StringVar(&dataFile, "data", "", "extra data (JSON file) merged at the data root")
	cmd.MarkFlagRequired("policy")
	cmd.MarkFlagRequired("input")
	return cmd
}

// loadPolicyDir loads dir and, with dataFile, merges that JSON object's
// top-level keys into the data document (each key's value must be an object;
// a key that collides with the directory's data is refused by the loader).
func loadPolicyDir(dir, dataFile string) (*policy.Bundle, error) {
	b, err := policy.LoadDir(dir)
	if err != nil || dataFile == "" {
		return b, err
	}
	raw, err := os.ReadFile(dataFile)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	var extra map[string]any
	if err := json.Unmarshal(raw, &extra); err != nil {
		return nil, fmt.Errorf("--data: not a JSON object: %w", err)
	}
	files := map[string][]byte{}
	for k, v := range extra {
		obj, ok := v.(map[string]any)
		if !ok || !fs.ValidPath(k) || strings.Contains(k, "/") {
			return nil, fmt.Errorf("--data: top-level key %q must hold an object", k)
		}
		files[k+"/data.json"], _ = json.Marshal(obj)
	}
	return b.With(files)
}

func newOfflineEngine(ctx context.Context, b *policy.Bundle, source, td string) (*authz.Engine, error) {
	id, err := spiffeid.TrustDomainFromString(td)
	if err != nil {
		return nil, fmt.Errorf("input.gateway.trust_domain: %w", err)
	}
	return authz.NewEngine(ctx, authz.Options{TrustDomain: id, Bundle: b, Source: source})
}

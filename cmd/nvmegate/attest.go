package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/compliance"
	"github.com/nvmegate/nvmegate/lineage"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) attestCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "attest", Short: "Get and verify signed attestations: a job's lineage, the fabric's compliance (auditors)"}
	var job string
	get := &cobra.Command{
		Use:   "lineage --job JOB_ID > FILE",
		Short: "Write a job's lineage attestation (DSSE envelope around an in-toto statement) to stdout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAuditClient(c).Lineage(ctx, &pb.LineageRequest{JobId: job})
				if err != nil {
					return err
				}
				_, err = a.stdout.Write(append(resp.Envelope, '\n'))
				return err
			})
		},
	}
	get.Flags().StringVar(&job, "job", "", "the job")
	get.MarkFlagRequired("job")

	comp := &cobra.Command{
		Use:   "compliance > FILE",
		Short: "Have the gateway sign a compliance attestation now and write it, with the proof of its record in the log, to stdout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				// A fabric of 10,000 namespaces makes a bundle of about
				// 8 MB, past gRPC's default 4 MB.
				resp, err := pb.NewAuditClient(c).Compliance(ctx, &pb.ComplianceRequest{}, grpc.MaxCallRecvMsgSize(maxComplianceBundle))
				if err != nil {
					return err
				}
				if _, err := a.stdout.Write(append(resp.Bundle, '\n')); err != nil {
					return err
				}
				fmt.Fprintf(a.stderr, "compliance attestation recorded at log index %d; %d finding(s) out of compliance\n", resp.Index, resp.OutOfCompliance)
				return nil
			})
		},
	}

	var (
		keyFiles  []string
		maxAge    time.Duration
		notBefore string
	)
	verify := &cobra.Command{
		Use:   "verify FILE --key FILE [--key FILE...] [--max-age DURATION] [--not-before TIME]",
		Short: "Verify an attestation offline (lineage or compliance): its signature, the checkpoints', every proof, and a compliance attestation's age",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := checkpointKeys(keyFiles)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				return errors.New("--key is required: verification trusts only the keys you give")
			}
			fresh := compliance.Freshness{MaxAge: maxAge}
			if maxAge < 0 {
				return fmt.Errorf("--max-age must be 0 (no bound) or positive, got %s", maxAge)
			}
			if notBefore != "" {
				if fresh.NotBefore, err = time.Parse(time.RFC3339, notBefore); err != nil {
					return fmt.Errorf("--not-before must be an RFC 3339 time such as 2026-12-07T01:00:00Z: %w", err)
				}
			}
			env, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			if isComplianceBundle(env) {
				return a.printCompliance(env, keys, fresh, !cmd.Flags().Changed("max-age"), time.Now())
			}
			// A lineage attestation proves a job's entries, each with its
			// own time; it states no time it was made, so there is nothing
			// to bound. Saying so beats ignoring a bound that was asked for.
			if cmd.Flags().Changed("max-age") || notBefore != "" {
				return errors.New("--max-age and --not-before apply to compliance attestations: a lineage attestation states no time it was made (its entries carry theirs)")
			}
			rep, err := lineage.Verify(env, keys)
			if err != nil {
				return fmt.Errorf("verification failed: %w", err)
			}
			if a.output == "json" {
				return json.NewEncoder(a.stdout).Encode(rep)
			}
			user := rep.User
			if user == "" {
				user = "(not named)"
			}
			_, err = fmt.Fprintf(a.stdout, "job:       %s generation %d (tenant %s, user %s)\nnodes:     %d (%s)\ndatasets:  %s\nentries:   %d, each proved in the signed log (tree size %d)\nsigned by: %s\nresult:    OK\n",
				rep.Job, rep.Generation, rep.Tenant, user, len(rep.Nodes), clipList(rep.Nodes, 3), strings.Join(rep.Datasets, ", "), rep.Entries, rep.TreeSize, rep.SignedBy)
			return err
		},
	}
	verify.Flags().StringSliceVar(&keyFiles, "key", nil, "public key of the log (v<N>.pem from an export's keys/)")
	verify.Flags().DurationVar(&maxAge, "max-age", compliance.DefaultMaxAge,
		"refuse a compliance attestation made longer ago than this (by its signed time); 0: no bound, to verify archived evidence")
	verify.Flags().StringVar(&notBefore, "not-before", "",
		"refuse a compliance attestation made before this RFC 3339 time (e.g. when you made a change it must reflect)")
	cmd.AddCommand(get, comp, verify)
	return cmd
}

// maxComplianceBundle bounds the compliance bundle the CLI accepts.
const maxComplianceBundle = 256 << 20

// isComplianceBundle tells a compliance bundle (an envelope with the proof
// of its record) from a bare lineage envelope.
func isComplianceBundle(data []byte) bool {
	var probe struct {
		Envelope json.RawMessage `json:"envelope"`
	}
	return json.Unmarshal(data, &probe) == nil && len(probe.Envelope) > 0
}

// printCompliance verifies a compliance bundle, refuses it outside fresh
// (measured at now) and prints what it states, its time and age first: a
// bundle proves what the fabric was when it was signed, and a replayed one
// verifies as well as a new one, so its age is the first thing to read.
// byDefault says that fresh.MaxAge is the default, not the caller's.
func (a *app) printCompliance(bundle []byte, keys []attest.PublicKey, fresh compliance.Freshness, byDefault bool, now time.Time) error {
	rep, err := compliance.Verify(bundle, keys)
	if err != nil {
		return fmt.Errorf("verification failed: %w", err)
	}
	age := now.Sub(rep.Time)
	if err := fresh.Check(rep, now); err != nil {
		if byDefault && age > fresh.MaxAge {
			return fmt.Errorf("verification failed: %w; %s is the default, pass --max-age 0 to verify archived evidence without a bound", err, compliance.Span(fresh.MaxAge))
		}
		return fmt.Errorf("verification failed: %w", err)
	}
	if fresh.MaxAge == 0 && age > compliance.DefaultMaxAge {
		fmt.Fprintf(a.stderr, "warning: this attestation states the fabric as of %s, %s; its age was not bounded (--max-age 0)\n",
			rep.Time.UTC().Format(time.RFC3339), compliance.Ago(age))
	}
	if a.output == "json" {
		return json.NewEncoder(a.stdout).Encode(struct {
			*compliance.Report
			VerifiedAt    time.Time `json:"verified_at"`
			AgeSeconds    int64     `json:"age_seconds"`
			MaxAgeSeconds int64     `json:"max_age_seconds,omitempty"`
			NotBefore     time.Time `json:"not_before,omitzero"`
		}{rep, now.UTC(), int64(age / time.Second), int64(fresh.MaxAge / time.Second), fresh.NotBefore.UTC()})
	}
	fmt.Fprintf(a.stdout, "issued:            %s (%s)\n", rep.Time.UTC().Format(time.RFC3339), compliance.Ago(age))
	bounds := "not bounded (--max-age 0)"
	if fresh.MaxAge > 0 {
		bounds = "within --max-age " + compliance.Span(fresh.MaxAge)
	}
	if !fresh.NotBefore.IsZero() {
		bounds += ", not before " + fresh.NotBefore.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(a.stdout, "freshness:         %s\n", bounds)
	fmt.Fprintf(a.stdout, "policy revision:   %s\n", rep.PolicyRevision)
	fmt.Fprintf(a.stdout, "stated:            %d namespace(s), %d active grant(s)\n", rep.Namespaces, rep.Grants)
	fmt.Fprintf(a.stdout, "anchored to:       the signed log at size %d; recorded at index %d (proved under size %d)\n", rep.AnchorSize, rep.RecordedAt, rep.TreeSize)
	fmt.Fprintf(a.stdout, "signed by:         %s\n", rep.SignedBy)
	enc, oldest := 0, int64(0)
	for _, t := range rep.Predicate.Tenants {
		for _, n := range t.Namespaces {
			if n.AtRest.Encrypted {
				enc++
				oldest = max(oldest, n.AtRest.DataKey.AgeSeconds)
			}
		}
	}
	fmt.Fprintf(a.stdout, "encrypted at rest: %d of %d namespace(s) (dm-crypt); oldest data key %s\n", enc, rep.Namespaces, time.Duration(oldest)*time.Second)
	if len(rep.OutOfCompliance) == 0 {
		fmt.Fprintln(a.stdout, "out of compliance: nothing")
	} else {
		fmt.Fprintf(a.stdout, "out of compliance: %d\n", len(rep.OutOfCompliance))
		for _, f := range rep.OutOfCompliance {
			fmt.Fprintf(a.stdout, "  - %s\n", f)
		}
	}
	_, err = fmt.Fprintf(a.stdout, "result:            OK (the attestation verifies; it states the fabric as of %s; its findings are above)\n", compliance.Ago(age))
	return err
}

// clipList joins the first n of s, saying how many more there are.
func clipList(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(s[:n], ", "), len(s)-n)
}

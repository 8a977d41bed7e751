package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/report"
)

// auditReportCmd writes an auditor's report: one HTML page of a job's or a
// tenant's entries over a period, verified first.
func (a *app) auditReportCmd() *cobra.Command {
	var (
		job, tenant, since, until, htmlOut, export string
		keyFiles                                   []string
	)
	cmd := &cobra.Command{
		Use:   "report (--job ID | --tenant T [--since TIME] [--until TIME]) --html FILE --key FILE [--export DIR]",
		Short: "Write an auditor's report (one self-contained HTML page): the log verified, then a timeline of the selection",
		Long: `Verify the log offline and render a job's entries, or a tenant's over a
period, as one HTML page with no external asset: the verification result
first (checkpoint, tree size, signer, failures), then a timeline of nodes and
subsystems with every grant, renewal, revocation and refusal, the policy
revisions and key versions behind them, and the compliance attestations of
the period. With --export DIR it reads an export (nvmegate audit export);
without, it exports the log from the gateway first. Times are RFC 3339.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (job == "") == (tenant == "") {
				return errors.New("give --job or --tenant (one of them)")
			}
			var from, to time.Time
			for _, t := range []struct {
				flag, v string
				out     *time.Time
			}{{"--since", since, &from}, {"--until", until, &to}} {
				if t.v == "" {
					continue
				}
				p, err := time.Parse(time.RFC3339, t.v)
				if err != nil {
					return fmt.Errorf("%s: %w", t.flag, err)
				}
				*t.out = p
			}
			keys, err := checkpointKeys(keyFiles)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				return errors.New("--key is required: the report shows a verification that trusts only the keys you give")
			}
			dir := export
			if dir == "" {
				tmp, err := os.MkdirTemp("", "nvmegate-report-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				if _, _, err := a.exportTo(cmd.Context(), tmp, 0); err != nil {
					return err
				}
				dir = tmp
			}
			ver, err := audit.Verify(cmd.Context(), dir, keys, nil, nil)
			if err != nil {
				return err
			}
			all, err := audit.ExportRecords(dir, ver.TreeSize)
			if err != nil {
				return err
			}
			var sel []audit.Record
			title := "job " + job
			if tenant != "" {
				title = "tenant " + tenant
				if !from.IsZero() || !to.IsZero() {
					title += fmt.Sprintf(", %s – %s", since, until)
				}
			}
			var jobStart time.Time
			for _, r := range all {
				e := r.Entry
				switch {
				case e.Kind == audit.EventComplianceAttestation:
					// The fabric's, not a tenant's or a job's: those of the
					// period (for a job, from its first entry on).
					if (from.IsZero() || !e.Time.Before(from)) && (to.IsZero() || e.Time.Before(to)) && (job == "" || !jobStart.IsZero()) {
						sel = append(sel, r)
					}
				case job != "" && e.JobID != job:
				case tenant != "" && e.Tenant != tenant:
				case !from.IsZero() && e.Time.Before(from), !to.IsZero() && !e.Time.Before(to):
				default:
					if jobStart.IsZero() {
						jobStart = e.Time
					}
					sel = append(sel, r)
				}
			}
			f, err := os.OpenFile(htmlOut, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			if err := report.HTML(f, report.Input{Title: title, Verification: ver, Records: sel, Now: time.Now()}); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			abs, _ := filepath.Abs(htmlOut)
			verdict := "verified"
			if !ver.OK() {
				verdict = "NOT VERIFIED"
			}
			_, err = fmt.Fprintf(a.stdout, "report of %s: %d entries, log %s at tree size %d %s; written to %s\n", title, len(sel), ver.Origin, ver.TreeSize, verdict, abs)
			return err
		},
	}
	cmd.Flags().StringVar(&job, "job", "", "the job")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant")
	cmd.Flags().StringVar(&since, "since", "", "with --tenant: entries from this time (RFC 3339)")
	cmd.Flags().StringVar(&until, "until", "", "with --tenant: entries before this time (RFC 3339)")
	cmd.Flags().StringVar(&htmlOut, "html", "", "the HTML file to write")
	cmd.Flags().StringVar(&export, "export", "", "an export directory to read instead of the gateway's log")
	cmd.Flags().StringSliceVar(&keyFiles, "key", nil, "public key of the log (v<N>.pem from an export's keys/)")
	cmd.MarkFlagRequired("html")
	return cmd
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nvmegate/nvmegate/nodeagent"
)

func statusCmd(stdout io.Writer) *cobra.Command {
	var socket, output string
	cmd := &cobra.Command{
		Use:   "status [--status-socket PATH] [-o table|json]",
		Short: "Show the running agent's grants, controllers, expiries and last renewal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o must be table or json, got %q", output)
			}
			st, raw, err := fetchStatus(cmd.Context(), socket)
			if err != nil {
				return err
			}
			if output == "json" {
				_, err := stdout.Write(raw)
				return err
			}
			return printStatus(stdout, st, time.Now())
		},
	}
	cmd.Flags().StringVar(&socket, "status-socket", defaultSocket, "the agent's status socket")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func fetchStatus(ctx context.Context, socket string) (nodeagent.Status, []byte, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/status", nil)
	if err != nil {
		return nodeagent.Status{}, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nodeagent.Status{}, nil, fmt.Errorf("no agent answers on %s: %w", socket, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nodeagent.Status{}, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nodeagent.Status{}, nil, fmt.Errorf("agent status: %s", resp.Status)
	}
	var st nodeagent.Status
	if err := json.Unmarshal(raw, &st); err != nil {
		return nodeagent.Status{}, nil, fmt.Errorf("agent status: %w", err)
	}
	return st, raw, nil
}

func printStatus(w io.Writer, st nodeagent.Status, now time.Time) error {
	fmt.Fprintf(w, "job %s, host NQN %s, running since %s\n", st.Job, st.HostNQN, st.Started.UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSYSTEM\tGRANT\tKEY\tCONTROLLER\tSTATE\tTLS\tEXPIRES IN\tLAST RENEWAL\tRE-KEYS\tERROR")
	for _, s := range st.Subsystems {
		expires, renewed := "-", "-"
		if !s.Expires.IsZero() {
			expires = s.Expires.Sub(now).Round(time.Second).String()
		}
		if !s.LastRenewal.IsZero() {
			renewed = now.Sub(s.LastRenewal).Round(time.Second).String() + " ago"
		}
		key := "-"
		if s.KeyVersion > 0 {
			key = fmt.Sprintf("v%d", s.KeyVersion)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\t%d\t%s\n", s.Subsystem, dash(s.Grant), key, dash(s.Controller), dash(s.State),
			s.TLS, expires, renewed, s.Rekeys, dash(s.Error))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

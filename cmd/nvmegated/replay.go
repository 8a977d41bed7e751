package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

// errDiffers is replay's answer when the store and the replay disagree.
var errDiffers = errors.New("the store's state differs from a fresh replay of the log")

// runReplay is `nvmegated replay`: with the gateway stopped, it brings the
// store up to the log (what a restart does), replays the whole log into a
// fresh store beside it, and compares their state digests (DESIGN §12:
// replay is the truth). It prints both; errDiffers if they differ.
func runReplay(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("nvmegated replay", flag.ContinueOnError)
	fs.SetOutput(out)
	stateDir := fs.String("state-dir", "", "the gateway's state directory (inventory.db)")
	auditPath := fs.String("audit", "", "the audit log (default STATE-DIR/audit.db)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *stateDir == "" || fs.NArg() > 0 {
		return errors.New("usage: nvmegated replay --state-dir DIR [--audit PATH]")
	}
	if *auditPath == "" {
		*auditPath = filepath.Join(*stateDir, "audit.db")
	}
	log, err := audit.Open(*auditPath, audit.Options{})
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	defer log.Close()
	digest := func(path string) (uint64, string, error) {
		db, err := store.Open(path, store.Options{Journal: log})
		if err != nil {
			return 0, "", err
		}
		defer db.Close()
		return db.StateDigest(ctx)
	}
	rev, live, err := digest(filepath.Join(*stateDir, "inventory.db"))
	if err != nil {
		return fmt.Errorf("the store: %w", err)
	}
	fmt.Fprintf(out, "store   revision %d %s\n", rev, live)
	tmp, err := os.MkdirTemp("", "nvmegated-replay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	frev, fresh, err := digest(filepath.Join(tmp, "inventory.db"))
	if err != nil {
		return fmt.Errorf("a fresh replay of the log: %w", err)
	}
	fmt.Fprintf(out, "replay  revision %d %s\n", frev, fresh)
	if frev != rev || fresh != live {
		return errDiffers
	}
	return nil
}

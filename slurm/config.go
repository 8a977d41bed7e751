package slurm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Config is the hooks' configuration file: Slurm runs a hook with no
// arguments and a bare environment (not even PATH), so everything the
// hook needs is in the file. Lines are "key = value"; '#' starts a
// comment. Keys:
//
//	tenant = acme                  # the tenant the cluster's jobs run for
//	regions = eu-west,eu-central   # the regions a job's data may be read in
//	slurm-conf = /etc/slurm/slurm.conf
//	scontrol = /usr/bin/scontrol   # a refused job's AdminComment and Requeue
//	squeue = /usr/bin/squeue       # the run's start and time limit
//	expiry-margin = 15m            # after the time limit, for the epilogs
//	unlimited-expiry = 168h        # the scope of a job without a time limit
//
// and the nvmegate CLI's identity flags without their dashes (addr,
// spiffe-socket, or cert, key and bundle; dev-dir and dev-identity on a
// dev gateway).
type Config struct {
	Identity        map[string]string
	Tenant          string
	Regions         []string
	SlurmConf       string
	Scontrol        string
	Squeue          string
	ExpiryMargin    time.Duration
	UnlimitedExpiry time.Duration
}

// ParseConfig reads a configuration file; identityKeys are the CLI's
// identity flags it may set.
func ParseConfig(r io.Reader, identityKeys []string) (Config, error) {
	c := Config{Identity: map[string]string{}, SlurmConf: "/etc/slurm/slurm.conf", Scontrol: "/usr/bin/scontrol",
		Squeue: "/usr/bin/squeue", ExpiryMargin: 15 * time.Minute, UnlimitedExpiry: 7 * 24 * time.Hour}
	err := parseKV(r, func(k, v string) (err error) {
		switch k {
		case "tenant":
			c.Tenant = v
		case "regions":
			c.Regions = strings.Split(v, ",")
			for i := range c.Regions {
				c.Regions[i] = strings.TrimSpace(c.Regions[i])
			}
		case "slurm-conf":
			c.SlurmConf = v
		case "scontrol":
			c.Scontrol = v
		case "squeue":
			c.Squeue = v
		case "expiry-margin":
			c.ExpiryMargin, err = time.ParseDuration(v)
		case "unlimited-expiry":
			c.UnlimitedExpiry, err = time.ParseDuration(v)
		default:
			if !slices.Contains(identityKeys, k) {
				return errUnknownKey
			}
			c.Identity[k] = v
		}
		return err
	})
	if err != nil {
		return c, err
	}
	if c.Tenant == "" || len(c.Regions) == 0 {
		return c, fmt.Errorf("tenant and regions are required")
	}
	return c, nil
}

// NodeConfig is the node hooks' configuration (Prolog, TaskProlog,
// Epilog), in the same form as Config's:
//
//	run-dir = /run/nvmegate/jobs   # each job's agent state, devices and log
//	connect-timeout = 5m           # how long the Prolog waits for every namespace
//
// and `nvmegate-node run`'s flags without their dashes: its identity
// (spiffe-socket, addr; dev-dir and dev-identity on a dev gateway), and
// keyring, renew-every, ttl.
type NodeConfig struct {
	Agent          map[string]string
	RunDir         string
	ConnectTimeout time.Duration
}

// ParseNodeConfig reads the node hooks' configuration; agentKeys are the
// agent's flags it may set.
func ParseNodeConfig(r io.Reader, agentKeys []string) (NodeConfig, error) {
	c := NodeConfig{Agent: map[string]string{}, RunDir: "/run/nvmegate/jobs", ConnectTimeout: 5 * time.Minute}
	err := parseKV(r, func(k, v string) (err error) {
		switch k {
		case "run-dir":
			c.RunDir = v
		case "connect-timeout":
			c.ConnectTimeout, err = time.ParseDuration(v)
		default:
			if !slices.Contains(agentKeys, k) || k == "job" || k == "status-socket" {
				return errUnknownKey
			}
			c.Agent[k] = v
		}
		return err
	})
	return c, err
}

var errUnknownKey = errors.New("unknown key")

// parseKV calls set with each "key = value" line of r.
func parseKV(r io.Reader, set func(k, v string) error) error {
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return fmt.Errorf("line %d: want key = value", n)
		}
		if err := set(k, v); errors.Is(err, errUnknownKey) {
			return fmt.Errorf("line %d: unknown key %q", n, k)
		} else if err != nil {
			return fmt.Errorf("line %d: %s: %w", n, k, err)
		}
	}
	return sc.Err()
}

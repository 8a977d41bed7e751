package hostlist_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/hostlist"
)

// valid are expressions Slurm expands, with the names it gives.
var valid = []struct {
	expr string
	want string
}{
	{"gpu001", "gpu001"},
	{"gpu[001-003,010],cpu7", "gpu001 gpu002 gpu003 gpu010 cpu7"},
	{"a[9-11]", "a9 a10 a11"},
	{"a[01-3]", "a01 a02 a03"},
	{"a[1-003]", "a1 a2 a3"},
	{"a[00-01]", "a00 a01"},
	{"a[0-0]", "a0"},
	{"a[7]", "a7"},
	{"a[998-1000]", "a998 a999 a1000"},
	{"a[098-100]", "a098 a099 a100"},
	{"rack[1-2]n[1-2]", "rack1n1 rack1n2 rack2n1 rack2n2"},
	{"a[1-2][3-4]", "a13 a14 a23 a24"},
	{"a[1-2]b[3]", "a1b3 a2b3"},
	{"[1-2]", "1 2"},
	{"a,,b", "a b"},
	{"a b", "a b"},
	{"node-1.x,a_b[1]", "node-1.x a_b1"},
	{"a[1-2,5-6],b[01-02]", "a1 a2 a5 a6 b01 b02"},
}

func TestExpand(t *testing.T) {
	for _, c := range valid {
		got, err := hostlist.Expand(c.expr, 100)
		if err != nil {
			t.Errorf("Expand(%q): %v", c.expr, err)
			continue
		}
		if want := strings.Fields(c.want); !slices.Equal(got, want) {
			t.Errorf("Expand(%q) = %v, want %v", c.expr, got, want)
		}
	}
}

// A repeated host is kept once, where it first appears (Slurm keeps both:
// a job's node appears once in its scope).
func TestExpandRepeats(t *testing.T) {
	got, err := hostlist.Expand("x[1-2],x1,x[2-3]", 10)
	if err != nil || !slices.Equal(got, []string{"x1", "x2", "x3"}) {
		t.Fatalf("Expand = %v (%v), want [x1 x2 x3]", got, err)
	}
}

func TestExpandRefuses(t *testing.T) {
	for _, expr := range []string{
		"", ",", "a[3-1]", "a[1-2]-b", "a[1-2]b", "a[1-3", "a1-3]", "a[[1]]", "a[]", "a[-1]", "a[1-]", "a[1,]",
		"a[ 1-2]", "a[x]", "é[1]", "a/b", "a[1-2]:b", "a[1234567890123456789]",
	} {
		got, err := hostlist.Expand(expr, 100)
		if !errors.Is(err, hostlist.ErrSyntax) {
			t.Errorf("Expand(%q) = %v, %v; want ErrSyntax", expr, got, err)
		}
	}
}

// The bound refuses at once, before any name is made, however many an
// expression names.
func TestExpandBound(t *testing.T) {
	for _, expr := range []string{"n[0-999999999999]", "a[1-1000]b[1-1000]c[1-1000]", "a[1-6],b[1-5]"} {
		if got, err := hostlist.Expand(expr, 10); !errors.Is(err, hostlist.ErrTooMany) {
			t.Errorf("Expand(%q, 10) = %d hosts, %v; want ErrTooMany", expr, len(got), err)
		}
	}
	// Repeats count against the bound: the work is bounded, not only the
	// answer.
	if got, err := hostlist.Expand("a[1-5],b[1-5],a[1-5]", 10); !errors.Is(err, hostlist.ErrTooMany) {
		t.Fatalf("ten hosts and five repeats under a bound of 10: %d, %v; want ErrTooMany", len(got), err)
	}
	if got, err := hostlist.Expand(strings.Repeat("a[1-100000],", 40), 100_000); !errors.Is(err, hostlist.ErrTooMany) {
		t.Fatalf("one range forty times: %d hosts, %v; want ErrTooMany", len(got), err)
	}
	if got, err := hostlist.Expand("a[1-5],a[3-4]", 7); err != nil || len(got) != 5 {
		t.Fatalf("repeats within the bound: %v, %v", got, err)
	}
	if _, err := hostlist.Expand(strings.Repeat("a,", hostlist.MaxLen/2+1), 1<<30); !errors.Is(err, hostlist.ErrTooMany) {
		t.Fatalf("an expression past MaxLen: %v", err)
	}
	got, err := hostlist.Expand("gpu[00001-10000]", 10000)
	if err != nil || len(got) != 10000 || got[0] != "gpu00001" || got[9999] != "gpu10000" {
		t.Fatalf("10,000 hosts: %d, %v", len(got), err)
	}
}

// Every expression Expand accepts, Slurm's own scontrol expands to the same
// names (once each), and every valid one above it accepts. Run where Slurm
// is installed (.ci/run installs it).
func TestSameAsSlurm(t *testing.T) {
	scontrol, err := exec.LookPath("scontrol")
	if err != nil {
		t.Skip("scontrol is not installed (apt-get install slurm-client)")
	}
	conf := filepath.Join(t.TempDir(), "slurm.conf")
	host, _ := os.Hostname()
	if err := os.WriteFile(conf, fmt.Appendf(nil, "ClusterName=t\nSlurmctldHost=%s\nNodeName=%s CPUs=1\nPartitionName=p Nodes=ALL Default=YES\n", host, host), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range valid {
		cmd := exec.Command(scontrol, "show", "hostnames", c.expr)
		cmd.Env = append(os.Environ(), "SLURM_CONF="+conf)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("scontrol show hostnames %q: %v", c.expr, err)
		}
		var slurm []string
		for _, h := range strings.Fields(string(out)) {
			if !slices.Contains(slurm, h) {
				slurm = append(slurm, h)
			}
		}
		got, err := hostlist.Expand(c.expr, 100)
		if err != nil || !slices.Equal(got, slurm) {
			t.Errorf("%q: Expand = %v (%v), scontrol = %v", c.expr, got, err, slurm)
		}
	}
}

func FuzzExpand(f *testing.F) {
	for _, c := range valid {
		f.Add(c.expr)
	}
	f.Add("n[0-999999999999]")
	f.Fuzz(func(t *testing.T, expr string) {
		got, err := hostlist.Expand(expr, 64)
		if err != nil {
			return
		}
		if len(got) == 0 || len(got) > 64 {
			t.Fatalf("Expand(%q) = %d hosts", expr, len(got))
		}
		seen := map[string]bool{}
		for _, h := range got {
			if h == "" || seen[h] || strings.ContainsAny(h, "[],") {
				t.Fatalf("Expand(%q) gave %q", expr, h)
			}
			seen[h] = true
		}
	})
}

package gateway_test

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden")

var dhchapRE = regexp.MustCompile(`DHHC-1:0[0-3]:[A-Za-z0-9+/=]+:`)

// treeOf renders the nvmet tree of stor-eu-1 with every secret replaced by
// a name for its value (s1, s2, … in order of appearance), after checking
// that each parses: the golden trees fix the structure and which hosts
// share or change keys, not the random keys themselves.
func treeOf(t *testing.T, g *testGateway, names map[string]string) string {
	t.Helper()
	root := filepath.Join(g.configfs, "stor-eu-1")
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			if filepath.IsAbs(target) { // as the driver makes them (configfs needs it); shown relative
				target, _ = filepath.Rel(filepath.Dir(p), target)
			}
			fmt.Fprintf(&b, "l %s -> %s\n", rel, target)
		case d.IsDir():
			fmt.Fprintf(&b, "d %s\n", rel)
		default:
			data, _ := os.ReadFile(p)
			v := strings.TrimSpace(string(data))
			if dhchapRE.MatchString(v) {
				if _, err := nvmefmt.ParseDHCHAP(v); err != nil {
					t.Fatalf("%s: %v", rel, err)
				}
				if names[v] == "" {
					names[v] = fmt.Sprintf("<secret %d>", len(names)+1)
				}
				v = names[v]
			}
			fmt.Fprintf(&b, "f %s %04o %s\n", rel, info.Mode().Perm(), v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "nvmet-"+name+".golden")
	if *updateGolden {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./gateway -run Golden -update)", err)
	}
	if got != string(want) {
		t.Fatalf("tree after %s differs from %s:\n--- got\n%s--- want\n%s", name, path, got, want)
	}
}

// The target's tree through a job's life, each step against its golden
// tree: two nodes connect; the root rotates and one renews (its key
// changes, the other's not); one releases; a short grant expires; an admin
// revokes the last.
func TestTargetTreeGolden(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	n1, n2 := pb.NewAccessClient(g.client(t, node)), pb.NewAccessClient(g.client(t, "/node/acme-gpu-2"))
	c1, err := n1.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "1-connect", treeOf(t, g, names))

	if _, err := pb.NewKeysClient(g.client(t, admin)).Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "2-rotate-renew", treeOf(t, g, names))

	if _, err := n1.Release(ctx, &pb.ReleaseRequest{GrantId: c1.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "3-release", treeOf(t, g, names))

	// acme-gpu-1 connects again, for a nanosecond: the sweeper ends it.
	if _, err := n1.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN, Ttl: durationpb.New(time.Nanosecond)}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.srv.SweepExpired(ctx); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "4-expiry", treeOf(t, g, names))

	if _, err := pb.NewAccessClient(g.client(t, admin)).Revoke(ctx, &pb.RevokeRequest{Selector: &pb.RevokeRequest_JobId{JobId: "job-1"}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "5-revoke", treeOf(t, g, names))
}

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

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nvmegate/nvmegate/audit"
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
	g, ctx := admittedGateway(t)
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

// The invalid_argument entries of a malformed request to every RPC, as a
// node (testdata/audit-invalid.golden): the caller, the RPC, the field and
// the rule, and never a value the caller sent. Regenerate with
//
//	go test ./gateway -run TestInvalidEntriesGolden -update
func TestInvalidEntriesGolden(t *testing.T) {
	g := startGateway(t)
	conn := g.client(t, node)
	n := 0
	for _, m := range apiMethods(t) {
		full := "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
		tc, ok := malformed[full]
		if !ok {
			continue
		}
		err := conn.Invoke(ctxT(t), full, tc.req, dynamicResponse(t, m))
		wantCode(t, err, codes.InvalidArgument, tc.field)
		n++
	}
	entries := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{string(audit.EventInvalid)}})
	if len(entries) != n {
		t.Fatalf("%d invalid_argument entries for %d malformed calls", len(entries), n)
	}
	var b strings.Builder
	for _, e := range entries {
		if e.Caller != "spiffe://nvmegate.test"+node {
			t.Errorf("entry of %q: caller %s", e.Detail, e.Caller)
		}
		fmt.Fprintf(&b, "%s\n", e.Detail)
	}
	path := filepath.Join("testdata", "audit-invalid.golden")
	if *updateGolden {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./gateway -run TestInvalidEntriesGolden -update)", err)
	}
	if b.String() != string(want) {
		t.Fatalf("invalid_argument entries differ from %s:\n--- got\n%s--- want\n%s", path, b.String(), want)
	}
}

package authz_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"testing"
	"testing/fstest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

// Builders of input.resource exactly as policy/README.md's contract has it,
// shared by the table, property and benchmark tests.

const (
	schedulerID = "spiffe://example.org/tenant/acme/scheduler/slurm"
	node2ID     = "spiffe://example.org/node/gpu-02"
	auditorID   = "spiffe://example.org/auditor/eve"
	targetID    = "spiffe://example.org/target/t1"
	subNQN      = "nqn.2026-01.org.example:acme-train"
	hostNQN     = "nqn.2014-08.org.nvmexpress:uuid:0c6f2d46-2b8c-5b0e-9b7a-6a3e2b1d7f10"
)

func targetRec(id, region, fabric string) map[string]any {
	return map[string]any{"id": id, "region": region, "fabric": fabric, "driver": "nvmet"}
}

func subsystemRec(nqn, tenant, target string, dhchap, tls bool) map[string]any {
	return map[string]any{"nqn": nqn, "tenant": tenant, "target_id": target, "dhchap": dhchap, "tls": tls}
}

// nsRec is a namespace record; tgt is its target (id, region, fabric).
func nsRec(nqn string, nsid int, tenant, region, class, mode string, tgt map[string]any) map[string]any {
	return map[string]any{
		"subsystem_nqn": nqn, "nsid": nsid, "tenant": tenant, "region": region, "data_class": class,
		"dataset": map[string]any{"name": fmt.Sprintf("ds/%d", nsid), "digest": "sha256:" + fmt.Sprintf("%064x", nsid)},
		"qos":     map[string]any{"max_iops": uint64(0), "max_mbps": uint64(0)},
		"mode":    mode,
		"target":  map[string]any{"id": tgt["id"], "region": tgt["region"], "fabric": tgt["fabric"]},
	}
}

func jobRec(id, tenant string, nodes, regions []string, expires time.Time, state string) map[string]any {
	return map[string]any{
		"job_id": id, "tenant": tenant, "scheduler": schedulerID, "nodes": anys(nodes),
		"allowed_regions": anys(regions), "expires_at": expires.UTC().Format(time.RFC3339Nano), "state": state,
	}
}

func bindingRec(id, nqn, tenant string, bound bool) map[string]any {
	return map[string]any{"spiffe_id": id, "host_nqn": nqn, "tenant": tenant, "bound": bound}
}

func anys[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// call is the input of id calling fullMethod about resource, at epoch.
func call(id, fullMethod string, resource map[string]any) *authz.Input {
	in := authz.NewInput(authz.ParseCaller(spiffeid.RequireFromString(id)), fullMethod, "", resource)
	in.Time = epoch
	return in
}

// benchNamespaces are n namespaces of acme on one subsystem, cycling
// through the default classes but immutable (so rw is allowed).
func benchNamespaces(n int, mode string) []any {
	t1 := targetRec("t1", "eu-west", "f1")
	classes := []string{"internal", "restricted", "public"}
	out := make([]any, n)
	for i := range out {
		ns := nsRec(subNQN, i+1, "acme", "eu-west", classes[i%len(classes)], mode, t1)
		ns["qos"] = map[string]any{"max_iops": uint64(10000 * (i + 1)), "max_mbps": uint64(0)}
		out[i] = ns
	}
	return out
}

// connectInput is a node's Connect to subNQN in job j1 of acme.
func connectInput(namespaces []any) *authz.Input {
	return call(nodeID, "/nvmegate.v1.Access/Connect", map[string]any{
		"kind": "subsystem", "tenant": "acme",
		"target":       targetRec("t1", "eu-west", "f1"),
		"subsystem":    subsystemRec(subNQN, "acme", "t1", true, true),
		"namespaces":   namespaces,
		"job":          jobRec("j1", "acme", []string{nodeID, node2ID}, []string{"eu-west"}, epoch.Add(24*time.Hour), "active"),
		"host_binding": bindingRec(nodeID, hostNQN, "acme", true),
		"request":      map[string]any{"host_nqn": hostNQN, "ttl": "2h", "mode": ""},
	})
}

// admitInput is acme's scheduler admitting job j1 for two nodes.
func admitInput(namespaces []any) *authz.Input {
	return call(schedulerID, "/nvmegate.v1.Jobs/Admit", map[string]any{
		"kind": "job", "tenant": "acme",
		"namespaces": namespaces,
		"job":        jobRec("j1", "acme", []string{nodeID, node2ID}, []string{"eu-west"}, epoch.Add(24*time.Hour), "requested"),
		"nodes": []any{
			bindingRec(nodeID, hostNQN, "acme", true),
			bindingRec(node2ID, "nqn.2014-08.org.nvmexpress:uuid:5d1e3c52-4a8e-5f0b-8c9d-2e4f6a8b0c1d", "", false),
		},
	})
}

// copyFS returns the files of b, to change and load as a candidate.
func copyFS(t testing.TB, b *policy.Bundle) fstest.MapFS {
	t.Helper()
	out := fstest.MapFS{}
	err := fs.WalkDir(b.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(b.FS(), p)
		out[p] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func jsonFile(t testing.TB, v any) *fstest.MapFile {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &fstest.MapFile{Data: data}
}

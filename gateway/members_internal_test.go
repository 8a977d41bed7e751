package gateway

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nvmegate/nvmegate"
)

// A membership answer follows the job's node list as it is now: a node
// removed from a new version of the job (a new list, as the store gives
// for a changed record) is no longer a member, and one added is.
func TestMemberSetsFollowTheJob(t *testing.T) {
	var ms memberSets
	nodes := make([]string, 100)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("spiffe://nvmegate.test/node/n%d", i)
	}
	j := &nvmegate.Job{ID: "job-1", Nodes: nodes}
	for _, n := range []string{nodes[0], nodes[99]} {
		if !ms.has(j, n) {
			t.Fatalf("%s not a member", n)
		}
	}
	if ms.has(j, "spiffe://nvmegate.test/node/other") {
		t.Fatal("a stranger is a member")
	}
	// A new version: n0 gone, another node in; same ID and length.
	v2 := append(slices.Clone(nodes[1:]), "spiffe://nvmegate.test/node/new")
	j2 := &nvmegate.Job{ID: "job-1", Nodes: v2}
	if ms.has(j2, nodes[0]) {
		t.Fatal("a node removed from the job is still a member")
	}
	if !ms.has(j2, "spiffe://nvmegate.test/node/new") {
		t.Fatal("a node added to the job is not a member")
	}
	// Short lists are scanned, with the same answers.
	short := &nvmegate.Job{ID: "job-2", Nodes: nodes[:3]}
	if !ms.has(short, nodes[2]) || ms.has(short, nodes[3]) {
		t.Fatal("short list membership wrong")
	}
	// Many jobs: the memo starts over rather than grow, answers stay right.
	for i := range maxMemberSets + 10 {
		jj := &nvmegate.Job{ID: fmt.Sprintf("job-%d", i+10), Nodes: nodes}
		if !ms.has(jj, nodes[50]) {
			t.Fatal("member lost")
		}
	}
	if len(ms.sets) > maxMemberSets {
		t.Fatalf("%d sets kept, want at most %d", len(ms.sets), maxMemberSets)
	}
}

package gateway

import (
	"slices"
	"sync"
	"unsafe"

	"github.com/nvmegate/nvmegate"
)

// memberSets answers "is this node one of the job's nodes" in constant
// time. Every node call asks it, and a job start of 10,000 nodes scanning a
// 10,000-entry list each would spend 10^8 string comparisons on it. A set
// is built once per version of a job's node list: the store shares a job's
// slices read-only until the record changes, so the list's backing array
// and length identify the version it was built from.
type memberSets struct {
	mu   sync.Mutex
	sets map[string]memberSet
}

type memberSet struct {
	data *string // the node list it was built from
	n    int
	set  map[string]struct{}
}

// Short lists are scanned: building a set costs more than a few compares.
const (
	minMemberSet  = 64
	maxMemberSets = 1024 // jobs with a set at once; past it they start over
)

func (ms *memberSets) has(j *nvmegate.Job, node string) bool {
	if len(j.Nodes) < minMemberSet {
		return slices.Contains(j.Nodes, node)
	}
	data := unsafe.SliceData(j.Nodes)
	ms.mu.Lock()
	s, ok := ms.sets[j.ID]
	ms.mu.Unlock()
	if !ok || s.data != data || s.n != len(j.Nodes) {
		s = memberSet{data: data, n: len(j.Nodes), set: make(map[string]struct{}, len(j.Nodes))}
		for _, n := range j.Nodes {
			s.set[n] = struct{}{}
		}
		ms.mu.Lock()
		if ms.sets == nil || len(ms.sets) >= maxMemberSets {
			ms.sets = map[string]memberSet{}
		}
		ms.sets[j.ID] = s
		ms.mu.Unlock()
	}
	_, ok = s.set[node]
	return ok
}

package audit_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/audit"
)

func TestQuery(t *testing.T) {
	ctx := context.Background()
	l, _ := newLog(t)
	const n = 20000 // more than one index flush
	appendParallel(t, l, 0, n)
	// Also an entry about a whole subsystem (no namespace listed).
	wide := sampleEntry(3)
	wide.Namespaces = nil
	wideIdx, _, err := l.Append(ctx, wide)
	if err != nil {
		t.Fatal(err)
	}
	total := uint64(n + 1)

	// all pages the query returns, checked against a scan.
	collect := func(f audit.Filter, size int) []uint64 {
		t.Helper()
		var out []uint64
		tok := ""
		for pages := 0; ; pages++ {
			recs, next, err := l.Query(ctx, f, audit.Page{Size: size, Token: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if len(out) > 0 && r.Index <= out[len(out)-1] {
					t.Fatalf("results out of order: %d after %d", r.Index, out[len(out)-1])
				}
				out = append(out, r.Index)
			}
			if next == "" {
				return out
			}
			tok = next
			if pages > 10000 {
				t.Fatal("pagination does not end")
			}
		}
	}
	all := collect(audit.Filter{}, audit.MaxPageSize)
	if uint64(len(all)) != total {
		t.Fatalf("full scan found %d of %d", len(all), total)
	}
	entries := map[uint64]audit.Entry{}
	for tok := ""; ; {
		rs, next, err := l.Query(ctx, audit.Filter{}, audit.Page{Size: 1000, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			entries[r.Index] = r.Entry
		}
		if next == "" {
			break
		}
		tok = next
	}
	t0 := time.Date(2026, 12, 1, 9, 0, 5, 0, time.UTC)
	t1 := t0.Add(3 * time.Second)
	for name, f := range map[string]audit.Filter{
		"job":             {JobID: "job-7"},
		"tenant":          {Tenant: "tenant-2"},
		"job+tenant":      {JobID: "job-7", Tenant: "tenant-2"},
		"subsystem":       {SubsystemNQN: "nqn.2026-01.io.nvmegate:sub-3"},
		"namespace":       {SubsystemNQN: "nqn.2026-01.io.nvmegate:sub-3", NSID: 2},
		"time":            {Since: t0, Until: t1},
		"kind":            {Kinds: []audit.EventKind{audit.EventGrant}, JobID: "job-1"},
		"kinds":           {Kinds: []audit.EventKind{audit.EventGrant, audit.EventDeny}},
		"none":            {JobID: "no-such-job"},
		"namespace, wide": {SubsystemNQN: wide.SubsystemNQN, NSID: 2},
	} {
		t.Run(name, func(t *testing.T) {
			got := collect(f, 37)
			var want []uint64
			for i := uint64(0); i < total; i++ {
				if match(f, entries[i]) {
					want = append(want, i)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("%d results, want %d", len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("result %d is %d, want %d", i, got[i], want[i])
				}
			}
		})
	}
	// The subsystem-wide entry is found by a namespace query.
	found := false
	for _, i := range collect(audit.Filter{SubsystemNQN: wide.SubsystemNQN, NSID: 2}, 100) {
		found = found || i == wideIdx
	}
	if !found {
		t.Fatal("subsystem-wide entry not found by namespace")
	}
	if _, _, err := l.Query(ctx, audit.Filter{}, audit.Page{Token: "garbage"}); !errors.Is(err, audit.ErrInvalidQuery) {
		t.Fatalf("bad token: %v", err)
	}
}

// match is the reference semantics of Filter.
func match(f audit.Filter, e audit.Entry) bool {
	if f.JobID != "" && e.JobID != f.JobID || f.Tenant != "" && e.Tenant != f.Tenant || len(f.Kinds) > 0 && !slices.Contains(f.Kinds, e.Kind) {
		return false
	}
	if !f.Since.IsZero() && e.Time.Before(f.Since) || !f.Until.IsZero() && !e.Time.Before(f.Until) {
		return false
	}
	if f.SubsystemNQN == "" {
		return true
	}
	listed := false
	for _, n := range e.Namespaces {
		if n.SubsystemNQN == f.SubsystemNQN {
			listed = true
			if f.NSID == 0 || n.NSID == f.NSID {
				return true
			}
		}
	}
	return e.SubsystemNQN == f.SubsystemNQN && (f.NSID == 0 || !listed)
}

func TestQueryAfterReopenIndexesTail(t *testing.T) {
	ctx := context.Background()
	l, path := newLog(t)
	appendN(t, l, 0, 100) // below the flush threshold: only in memory
	l.Close()
	l = openLog(t, path, testSigner(t, "key-v1", 1))
	defer l.Close()
	recs, _, err := l.Query(ctx, audit.Filter{JobID: "job-3"}, audit.Page{})
	if err != nil || len(recs) != 2 {
		t.Fatalf("after reopen: %d records, %v", len(recs), err)
	}
}

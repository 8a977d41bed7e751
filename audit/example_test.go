package audit_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
)

// A gateway appends an entry before it answers, a checkpointer signs, and
// an auditor verifies an inclusion proof and then a whole export offline.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "audit-example")
	defer os.RemoveAll(dir)

	signer, _ := attest.NewLocalSigner(ed25519.NewKeyFromSeed(make([]byte, 32)), 1)
	log, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.example/audit", Signer: signer})
	if err != nil {
		panic(err)
	}
	defer log.Close()

	idx, leaf, err := log.Append(ctx, audit.Entry{
		Time:     time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC),
		Kind:     audit.EventGrant,
		JobID:    "job-7",
		Tenant:   "acme",
		Decision: &audit.Decision{Allow: true, ID: "d-1", PolicyRevision: "r1"},
		Keys:     []audit.KeyRef{{Class: "access_root", ID: "nqn.2026-01.io.example:ds", Version: 3, Fingerprint: "hmac-sha256:…"}},
	})
	if err != nil {
		panic(err) // the gateway would deny here
	}
	cp, _ := log.Checkpoint(ctx)
	p, _ := log.InclusionProof(ctx, idx, cp.Size)
	fmt.Println("included:", proof.VerifyInclusion(rfc6962.DefaultHasher, idx, cp.Size, leaf[:], p, cp.Hash[:]) == nil)

	out := filepath.Join(dir, "export")
	log.Export(ctx, out, 0)
	report, _ := audit.Verify(ctx, out, []attest.PublicKey{signer.PublicKey()}, nil, nil)
	fmt.Println("export verifies:", report.OK(), "entries:", report.Entries)
	// Output:
	// included: true
	// export verifies: true entries: 1
}

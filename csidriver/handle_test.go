package csidriver

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHandle(t *testing.T) {
	v := Volume{NQN: "nqn.2026-01.io.example:acme-train", NSID: 7, Job: "team-a.train-7"}
	h := v.Handle()
	if h != "nqn.2026-01.io.example:acme-train/7@team-a.train-7" {
		t.Fatalf("Handle = %q", h)
	}
	if got, err := ParseHandle(h); err != nil || got != v {
		t.Fatalf("ParseHandle(%q) = %+v, %v", h, got, err)
	}
	for _, bad := range []string{
		"", "fake-vol-id", "nqn.2026-01.io.example:a/1", // no job
		"nqn.2026-01.io.example:a@job",          // no nsid
		"nqn.2026-01.io.example:a/x@job",        // nsid not a number
		"nqn.2026-01.io.example:a/0@job",        // nsid 0
		"nqn.2026-01.io.example:a/4294967296@j", // nsid past 32 bits
		"nqn.2026-01.io.example:a/01@job",       // not canonical: an alias of /1
		"nqn.2026-01.io.example:a/1@",           // empty job
		"nqn.2026-01.io.example:a/1@-job",       // job not an ID
		"not-an-nqn/1@job",
	} {
		if _, err := ParseHandle(bad); err == nil {
			t.Errorf("ParseHandle(%q) succeeded", bad)
		}
	}
}

func FuzzParseHandle(f *testing.F) {
	f.Add("nqn.2026-01.io.example:acme-train/7@team-a.train-7")
	f.Add("nqn.2026-01.io.example:a/b/1@x@y")
	f.Add("fake-vol-id")
	f.Fuzz(func(t *testing.T, h string) {
		v, err := ParseHandle(h)
		if err != nil {
			if len(err.Error()) > 1000 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		// What parses, prints back as itself.
		if v.Handle() != h {
			t.Fatalf("ParseHandle(%q).Handle() = %q", h, v.Handle())
		}
	})
}

func TestModeOf(t *testing.T) {
	block := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: m}}
	}
	for _, c := range []struct {
		cap      *csi.VolumeCapability
		readonly bool
		want     string // mode, or the error's text
	}{
		{block(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY), false, "ro"},
		{block(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY), false, "ro"},
		{block(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), false, "rw"},
		{block(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), true, "ro"},
		{block(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), false, "is not supported"},
		{block(csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER), false, "is not supported"},
		{block(csi.VolumeCapability_AccessMode_UNKNOWN), false, "access_mode is required"},
		{&csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY}}, false, "volumeMode: Block"},
		{nil, false, "volume_capability is required"},
	} {
		got, err := modeOf(c.cap, c.readonly)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
				t.Errorf("modeOf(%v, %v) = %v; want InvalidArgument %q", c.cap, c.readonly, err, c.want)
			}
			continue
		}
		if got != c.want {
			t.Errorf("modeOf(%v, %v) = %q; want %q", c.cap, c.readonly, got, c.want)
		}
	}
}

func TestFromGateway(t *testing.T) {
	for in, want := range map[codes.Code]codes.Code{
		codes.PermissionDenied: codes.PermissionDenied, codes.Unauthenticated: codes.PermissionDenied,
		codes.NotFound: codes.NotFound, codes.Unavailable: codes.Unavailable, codes.Internal: codes.Internal,
		codes.Unknown: codes.Internal, codes.DataLoss: codes.Internal,
	} {
		err := fromGateway("admit job j", status.Error(in, "policy: no"))
		if status.Code(err) != want || !strings.Contains(err.Error(), "admit job j: nvmegate: policy: no") {
			t.Errorf("fromGateway(%s) = %v; want %s with the gateway's message", in, err, want)
		}
	}
}

package etcdlog

import (
	"reflect"
	"testing"

	"github.com/nvmegate/nvmegate/audit"
)

// A commit record read from etcd decodes without panicking, and what
// decodes encodes back to a record that decodes the same.
func FuzzDecodeCommit(f *testing.F) {
	f.Add(make([]byte, 72))
	f.Add(append(make([]byte, 72), 0, 2, '{', '}'))
	f.Add([]byte{1, 2, 3})
	f.Add(encodeCommit(audit.Commit{End: 2, Records: []byte{0, 2, '{', '}'},
		Changes: []audit.ChangeRecord{{Revision: 7, Index: 1, Payload: []byte("writes")}, {Revision: 8, Index: 1, Snapshot: true}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommit(b)
		if err != nil {
			return
		}
		if len(c.Changes) == 0 && b[0] != changesMark && len(c.Records) != len(b)-72 {
			t.Fatalf("%d bytes of records from a %d-byte record", len(c.Records), len(b))
		}
		again, err := decodeCommit(encodeCommit(c))
		if err != nil {
			t.Fatalf("a decoded commit encodes to a record that does not decode: %v", err)
		}
		if !reflect.DeepEqual(norm(again), norm(c)) {
			t.Fatalf("round trip: %+v, then %+v", c, again)
		}
	})
}

// norm makes empty and nil slices alike.
func norm(c audit.Commit) audit.Commit {
	if len(c.Records) == 0 {
		c.Records = nil
	}
	for i := range c.Changes {
		if len(c.Changes[i].Payload) == 0 {
			c.Changes[i].Payload = nil
		}
	}
	if len(c.Changes) == 0 {
		c.Changes = nil
	}
	return c
}

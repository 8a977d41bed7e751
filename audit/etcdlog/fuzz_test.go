package etcdlog

import "testing"

// A commit record read from etcd decodes without panicking.
func FuzzDecodeCommit(f *testing.F) {
	f.Add(make([]byte, 72))
	f.Add(append(make([]byte, 72), 0, 2, '{', '}'))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommit(b)
		if err == nil && len(c.Records) != len(b)-72 {
			t.Fatalf("%d bytes of records from a %d-byte record", len(c.Records), len(b))
		}
	})
}

package store_test

import (
	"bytes"
	"testing"

	"github.com/nvmegate/nvmegate/store"
)

// A change or snapshot chunk read from the journal or etcd decodes without panicking,
// and what decodes encodes back to the same bytes.
func FuzzDecodeWrites(f *testing.F) {
	f.Add(store.EncodeWrites(nil, []store.Write{{Bucket: []byte("grants"), Key: []byte("g1"), Value: []byte(`{"v":1}`)},
		{Bucket: []byte("grants_by_node"), Key: []byte("n\x00j\x00s\x00g1"), Delete: true}}))
	f.Add([]byte{0, 3, 'a', 'b'})
	f.Add([]byte{1, 0, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		ws, err := store.DecodeWrites(b)
		if err != nil {
			return
		}
		if got := store.EncodeWrites(nil, ws); !bytes.Equal(got, b) {
			t.Fatalf("%x decodes to writes that encode to %x", b, got)
		}
	})
}

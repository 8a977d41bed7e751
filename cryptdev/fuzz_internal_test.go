package cryptdev

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// A journal read back after a crash is written to the device only if it
// is whole and of the chunk due: anything else (torn, another chunk's,
// garbage) leaves the device as it was, and nothing panics.
func FuzzReplayJournal(f *testing.F) {
	good := func(off uint64, data []byte) []byte {
		b := binary.BigEndian.AppendUint64(nil, off)
		b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
		sum := sha256.Sum256(data)
		return append(append(b, sum[:]...), data...)
	}
	f.Add(good(512, bytes.Repeat([]byte{7}, 512)), int64(512))
	f.Add(good(0, []byte("x")), int64(512))
	f.Add([]byte{1, 2, 3}, int64(0))
	f.Fuzz(func(t *testing.T, journal []byte, off int64) {
		if off < 0 || off > 1<<20 {
			return
		}
		dir := t.TempDir()
		jp, dev := filepath.Join(dir, "j"), filepath.Join(dir, "dev")
		before := bytes.Repeat([]byte{0xAA}, 4096)
		if err := os.WriteFile(jp, journal, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dev, before, 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := replayJournal(d, jp, off); err != nil {
			return
		}
		after, _ := os.ReadFile(dev)
		whole := len(journal) >= journalHeader && int64(binary.BigEndian.Uint64(journal)) == off &&
			int(binary.BigEndian.Uint32(journal[8:])) == len(journal)-journalHeader &&
			sha256.Sum256(journal[journalHeader:]) == [32]byte(journal[12:journalHeader])
		if !whole && !bytes.Equal(after, before) {
			t.Fatalf("a journal not whole or not of chunk %d changed the device", off)
		}
	})
}

// A re-encryption record of any content is read or refused as malformed,
// and Check on it decides without panicking.
func FuzzProgressRecord(f *testing.F) {
	f.Add([]byte(`{"device":"/dev/loop0","from":"a","to":"b","size":4096,"offset":512,"done":false}`))
	f.Add([]byte(`{"done":true}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, rec []byte) {
		r := &Rekey{Dir: t.TempDir()}
		if err := os.WriteFile(filepath.Join(r.Dir, testName+".reencrypt"), rec, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.Progress(testName); err != nil {
			return
		}
		_ = r.Check(testName, "/dev/loop0", make([]byte, 32))
	})
}

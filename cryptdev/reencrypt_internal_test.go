package cryptdev

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// device makes a file holding plain encrypted under key as dm-crypt
// would (aes-xts-plain64, the sector number as tweak).
func device(t *testing.T, plain, key []byte) string {
	t.Helper()
	c, err := xtsCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	ct := bytes.Clone(plain)
	for i := 0; i+SectorSize <= len(ct); i += SectorSize {
		c.Encrypt(ct[i:i+SectorSize], ct[i:i+SectorSize], uint64(i/SectorSize))
	}
	p := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(p, ct, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readPlain(t *testing.T, path string, key []byte) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := xtsCipher(key)
	for i := 0; i+SectorSize <= len(b); i += SectorSize {
		c.Decrypt(b[i:i+SectorSize], b[i:i+SectorSize], uint64(i/SectorSize))
	}
	return b
}

func key(t *testing.T) []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

const testName = Prefix + "00112233445566778899aabb"

func TestRekeyRun(t *testing.T) {
	plain := make([]byte, 10*SectorSize+100) // a tail that is no whole sector
	rand.Read(plain)
	a, b := key(t), key(t)
	dev := device(t, plain, a)
	before, _ := os.ReadFile(dev)
	r := &Rekey{Dir: t.TempDir(), ChunkSize: 3 * SectorSize}
	if err := r.Check(testName, dev, a); err != nil {
		t.Fatalf("Check without a record: %v", err)
	}
	if err := r.Run(context.Background(), testName, dev, a, b); err != nil {
		t.Fatal(err)
	}
	got := readPlain(t, dev, b)
	if !bytes.Equal(got[:10*SectorSize], plain[:10*SectorSize]) {
		t.Fatal("the device does not read back under the new key")
	}
	after, _ := os.ReadFile(dev)
	if !bytes.Equal(after[10*SectorSize:], before[10*SectorSize:]) {
		t.Error("the tail past the last whole sector changed")
	}
	if bytes.Equal(after[:SectorSize], before[:SectorSize]) {
		t.Error("the first sector did not change")
	}
	p, ok, err := r.Progress(testName)
	if err != nil || !ok || !p.Done || p.Offset != 10*SectorSize {
		t.Fatalf("Progress = %+v %v %v", p, ok, err)
	}
	// Run again: nothing to do, nothing changes.
	if err := r.Run(context.Background(), testName, dev, a, b); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(dev); !bytes.Equal(again, after) {
		t.Fatal("a second run changed a re-encrypted device")
	}
	// The old key is refused, another device is refused, the new key
	// takes over and the record goes.
	if err := r.Check(testName, dev, a); err == nil {
		t.Error("Check with the old key after re-encryption: accepted")
	}
	if err := r.Check(testName, dev+"x", b); err == nil {
		t.Error("Check for another device: accepted")
	}
	// A key of neither side (both crypto-erased, a new namespace on the
	// device): the record is dropped.
	r2 := &Rekey{Dir: t.TempDir()}
	c := key(t)
	dev2 := device(t, make([]byte, 4*SectorSize), a)
	ctx, cancel := context.WithCancel(context.Background())
	crash = func(string, int64) bool { cancel(); return false }
	r2.Run(ctx, testName, dev2, a, b)
	crash = func(string, int64) bool { return false }
	if err := r2.Check(testName, dev2, a); err == nil {
		t.Error("a part re-encrypted device: accepted under the old key")
	}
	if err := r2.Check(testName, dev2, c); err != nil {
		t.Errorf("a new key after a crypto-erase: %v", err)
	}
	if _, ok, _ := r2.Progress(testName); ok {
		t.Error("the record of erased keys stayed")
	}
	if err := r.Check(testName, dev, b); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := r.Progress(testName); ok {
		t.Error("the record outlived the check that handed the device to the new key")
	}
}

// A run that dies at any stage of any chunk, torn writes included, and is
// run again leaves every sector readable under the new key; a device that
// is part re-encrypted opens under neither key.
func TestRekeyCrash(t *testing.T) {
	plain := make([]byte, 8*SectorSize)
	rand.Read(plain)
	for _, stage := range []string{"journaled", "written"} {
		for _, at := range []int64{0, 2 * SectorSize, 6 * SectorSize} {
			a, b := key(t), key(t)
			dev := device(t, plain, a)
			r := &Rekey{Dir: t.TempDir(), ChunkSize: 2 * SectorSize}
			crash = func(s string, off int64) bool {
				if s != stage || off != at {
					return false
				}
				if s == "journaled" { // the process dies mid-write: half the chunk is garbage
					f, _ := os.OpenFile(dev, os.O_WRONLY, 0)
					junk := make([]byte, SectorSize)
					rand.Read(junk)
					f.WriteAt(junk, off)
					f.Close()
				}
				return true
			}
			err := r.Run(context.Background(), testName, dev, a, b)
			crash = func(string, int64) bool { return false }
			if !errors.Is(err, errCrash) {
				t.Fatalf("%s@%d: Run = %v", stage, at, err)
			}
			if err := r.Check(testName, dev, a); err == nil {
				t.Errorf("%s@%d: a part re-encrypted device opens under the old key", stage, at)
			}
			if err := r.Check(testName, dev, b); err == nil {
				t.Errorf("%s@%d: a part re-encrypted device opens under the new key", stage, at)
			}
			if err := r.Run(context.Background(), testName, dev, a, b); err != nil {
				t.Fatalf("%s@%d: resume: %v", stage, at, err)
			}
			if !bytes.Equal(readPlain(t, dev, b), plain) {
				t.Errorf("%s@%d: data lost across the crash", stage, at)
			}
		}
	}
}

func TestRekeyRefusals(t *testing.T) {
	a, b, c := key(t), key(t), key(t)
	dev := device(t, make([]byte, 4*SectorSize), a)
	r := &Rekey{Dir: t.TempDir()}
	if err := r.Run(context.Background(), testName, dev, a, a); err == nil {
		t.Error("re-encryption to the same key: accepted")
	}
	if err := r.Run(context.Background(), "nvme0n1", dev, a, b); err == nil {
		t.Error("a name not ours: accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx, testName, dev, a, b); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run(cancelled) = %v", err)
	}
	// A record between a and b: a run between other keys must not touch it.
	if err := r.Run(context.Background(), testName, dev, a, c); err == nil {
		t.Error("a run to another key over a record: accepted")
	}
	if err := r.Run(context.Background(), testName, dev, a, b); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background(), testName, dev, b, c); err == nil {
		t.Error("a second rotation over a record not yet taken over: accepted")
	}
}

package cryptdev

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/crypto/xts"
)

// SectorSize is dm-crypt's default sector (the unit of the plain64 IV).
const SectorSize = 512

// KeyID names the key a device is encrypted under, for the re-encryption
// record: a labelled digest of the dm-crypt key, from which nothing about
// the key can be learnt.
func KeyID(dataKey []byte) (string, error) {
	k, err := XTSKey(dataKey)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(append([]byte("nvmegate key id v1\x00"), k...))
	return hex.EncodeToString(s[:8]), nil
}

// Progress is the record of a re-encryption of one device, kept beside
// its journal: the device's sectors below Offset are under key To, the
// rest under From. It holds no key.
type Progress struct {
	Device string `json:"device"`
	From   string `json:"from"` // KeyID
	To     string `json:"to"`   // KeyID
	Size   int64  `json:"size"` // bytes re-encrypted in all (whole sectors)
	Offset int64  `json:"offset"`
	Done   bool   `json:"done"`
}

// Rekey re-encrypts a plain dm-crypt device (Cipher, no header) from one
// data key to another, offline: nothing may have the device open (it is
// opened exclusively). It is the userspace twin of dm-crypt's
// aes-xts-plain64: 512-byte sectors, each XTS-encrypted with its sector
// number as the tweak.
//
// It survives a crash at any point. Each chunk's old ciphertext goes to a
// journal (synced) before the chunk is overwritten; the progress record
// (synced, replaced by rename) advances after the chunk is synced. On a
// restart, a journal for the chunk at the recorded offset is written back
// first: a chunk is never decrypted with the wrong key. The record and
// journal live in Dir under the mapping's name; losing them while a
// re-encryption is under way loses the device's data, as losing a LUKS2
// header would.
type Rekey struct {
	Dir string // holds <name>.reencrypt and <name>.journal
	// ChunkSize is the unit of work and of the journal; 0 is 4 MiB.
	ChunkSize int
}

func (r *Rekey) paths(name string) (progress, journal string, err error) {
	if !nameRE.MatchString(name) {
		return "", "", fmt.Errorf("cryptdev: %q is not a mapping name of ours", name)
	}
	return filepath.Join(r.Dir, name+".reencrypt"), filepath.Join(r.Dir, name+".journal"), nil
}

// Progress reads name's re-encryption record; ok is false without one.
func (r *Rekey) Progress(name string) (p Progress, ok bool, err error) {
	pp, _, err := r.paths(name)
	if err != nil {
		return Progress{}, false, err
	}
	b, err := os.ReadFile(pp)
	if errors.Is(err, os.ErrNotExist) {
		return Progress{}, false, nil
	}
	if err != nil {
		return Progress{}, false, fmt.Errorf("cryptdev: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return Progress{}, false, fmt.Errorf("cryptdev: %s: malformed re-encryption record", pp)
	}
	return p, true, nil
}

// Check reports whether device may be opened as name with dataKey: there
// is no re-encryption record, or the record says the whole device is
// under dataKey now (it is then removed: the mapping takes over).
func (r *Rekey) Check(name, device string, dataKey []byte) error {
	p, ok, err := r.Progress(name)
	if err != nil || !ok {
		return err
	}
	id, err := KeyID(dataKey)
	if err != nil {
		return err
	}
	switch {
	case p.Device != device:
		return fmt.Errorf("cryptdev: %s has a re-encryption record for another device (%s)", name, p.Device)
	case p.Done && p.To == id, !p.Done && p.Offset == 0 && p.From == id && !r.journaled(name),
		p.From != id && p.To != id:
		// The last case: a key of neither side. Both were destroyed
		// (a crypto-erase, and the namespace made again with a new
		// key): what the record describes is unreadable anyway.
		pp, jp, _ := r.paths(name)
		os.Remove(jp)
		if err := os.Remove(pp); err != nil {
			return fmt.Errorf("cryptdev: %w", err)
		}
		return syncDir(r.Dir)
	case p.Done:
		return fmt.Errorf("cryptdev: %s was re-encrypted to another key than the one given", name)
	default:
		return fmt.Errorf("cryptdev: %s is part re-encrypted (%d of %d bytes); it opens under neither key", name, p.Offset, p.Size)
	}
}

// journaled: a chunk may have been overwritten after the record was.
func (r *Rekey) journaled(name string) bool {
	_, jp, _ := r.paths(name)
	_, err := os.Stat(jp)
	return !errors.Is(err, os.ErrNotExist)
}

// Run re-encrypts device, known as mapping name, from key from to key to,
// starting or resuming. It returns when the whole device is under to, or
// on ctx's end or an error (it can be run again). A device already
// re-encrypted to to is left alone.
func (r *Rekey) Run(ctx context.Context, name, device string, from, to []byte) error {
	fromID, err := KeyID(from)
	if err != nil {
		return err
	}
	toID, err := KeyID(to)
	if err != nil {
		return err
	}
	if fromID == toID {
		return errors.New("cryptdev: re-encryption to the same key")
	}
	pp, jp, err := r.paths(name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return fmt.Errorf("cryptdev: %w", err)
	}
	p, ok, err := r.Progress(name)
	if err != nil {
		return err
	}
	if ok && (p.Device != device || p.From != fromID || p.To != toID) {
		return fmt.Errorf("cryptdev: %s has a re-encryption record between other keys or for another device; it is not overwritten", name)
	}
	if ok && p.Done {
		return nil
	}
	// O_EXCL on a block device: refused while a mapping, a mount or
	// another Run holds it.
	f, err := os.OpenFile(device, os.O_RDWR|syscall.O_EXCL, 0)
	if err != nil {
		return fmt.Errorf("cryptdev: open %s exclusively: %w", device, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("cryptdev: %s: %w", device, err)
	}
	size -= size % SectorSize
	if !ok {
		p = Progress{Device: device, From: fromID, To: toID, Size: size}
		if err := writeProgress(pp, p); err != nil {
			return err
		}
	} else if p.Size != size {
		return fmt.Errorf("cryptdev: %s changed size during its re-encryption (%d, was %d)", device, size, p.Size)
	}
	if err := replayJournal(f, jp, p.Offset); err != nil {
		return err
	}
	dec, err := xtsCipher(from)
	if err != nil {
		return err
	}
	enc, err := xtsCipher(to)
	if err != nil {
		return err
	}
	chunk := r.ChunkSize
	if chunk <= 0 {
		chunk = 4 << 20
	}
	chunk -= chunk % SectorSize
	if chunk == 0 {
		chunk = SectorSize
	}
	buf := make([]byte, chunk)
	for p.Offset < size {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := int(min(int64(chunk), size-p.Offset))
		b := buf[:n]
		if _, err := f.ReadAt(b, p.Offset); err != nil {
			return fmt.Errorf("cryptdev: read %s at %d: %w", device, p.Offset, err)
		}
		if err := writeJournal(jp, p.Offset, b); err != nil {
			return err
		}
		if crash("journaled", p.Offset) {
			return errCrash
		}
		sector := uint64(p.Offset / SectorSize)
		for i := 0; i < n; i += SectorSize {
			s := b[i : i+SectorSize]
			dec.Decrypt(s, s, sector)
			enc.Encrypt(s, s, sector)
			sector++
		}
		if _, err := f.WriteAt(b, p.Offset); err != nil {
			return fmt.Errorf("cryptdev: write %s at %d: %w", device, p.Offset, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("cryptdev: sync %s: %w", device, err)
		}
		if crash("written", p.Offset) {
			return errCrash
		}
		p.Offset += int64(n)
		p.Done = p.Offset == size
		if err := writeProgress(pp, p); err != nil {
			return err
		}
	}
	clear(buf)
	if !p.Done { // an empty device
		p.Done = true
		if err := writeProgress(pp, p); err != nil {
			return err
		}
	}
	os.Remove(jp)
	return nil
}

// crash stands in for the process dying at a stage of a chunk (tests).
var crash = func(stage string, off int64) bool { return false }

var errCrash = errors.New("cryptdev: simulated crash")

func xtsCipher(dataKey []byte) (*xts.Cipher, error) {
	k, err := XTSKey(dataKey)
	if err != nil {
		return nil, err
	}
	defer clear(k)
	return xts.NewCipher(aes.NewCipher, k)
}

// The journal: offset (8 bytes), length (4), SHA-256 of the data (32),
// the data (the chunk's ciphertext before it was overwritten).
const journalHeader = 8 + 4 + sha256.Size

func writeJournal(path string, off int64, data []byte) error {
	h := make([]byte, journalHeader, journalHeader+len(data))
	binary.BigEndian.PutUint64(h, uint64(off))
	binary.BigEndian.PutUint32(h[8:], uint32(len(data)))
	sum := sha256.Sum256(data)
	copy(h[12:], sum[:])
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("cryptdev: journal: %w", err)
	}
	_, werr := f.Write(append(h, data...))
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("cryptdev: journal: %w", werr)
	}
	return nil
}

// replayJournal writes back the journaled chunk if it is the one at off
// (the last run stopped while writing it); a torn or older journal is
// ignored: its chunk was never overwritten, or is recorded done.
func replayJournal(f *os.File, path string, off int64) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cryptdev: journal: %w", err)
	}
	if len(b) < journalHeader {
		return nil
	}
	joff := int64(binary.BigEndian.Uint64(b))
	n := int(binary.BigEndian.Uint32(b[8:]))
	data := b[journalHeader:]
	if joff != off || n != len(data) || sha256.Sum256(data) != [32]byte(b[12:journalHeader]) {
		return nil
	}
	if _, err := f.WriteAt(data, off); err != nil {
		return fmt.Errorf("cryptdev: journal replay at %d: %w", off, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("cryptdev: journal replay: %w", err)
	}
	return nil
}

func writeProgress(path string, p Progress) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("cryptdev: re-encryption record: %w", err)
	}
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr == nil {
		werr = syncDir(filepath.Dir(path))
	}
	if werr != nil {
		return fmt.Errorf("cryptdev: re-encryption record: %w", werr)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Job is one re-encryption to run: the device of a namespace's mapping,
// the keys (secret), and what to report when it ends.
type Job struct {
	Name, Device string
	From, To     []byte
	Subsystem    string
	NSID         uint32
	Generation   uint64 // of To
}

// Runner runs re-encryptions in the background, one per mapping at a
// time, and reports each one's end. Starting a job that is running does
// nothing; starting one that has finished runs nothing and reports again
// (a report the gateway did not take is repeated at the next state).
type Runner struct {
	Rekey *Rekey
	// Done hears of each job's end: err nil when the whole device is
	// under the job's To key.
	Done func(j Job, err error)

	mu      sync.Mutex
	running map[string]bool
}

// Check is Rekey.Check, refused while a job of name runs.
func (r *Runner) Check(name, device string, dataKey []byte) error {
	r.mu.Lock()
	busy := r.running[name]
	r.mu.Unlock()
	if busy {
		return fmt.Errorf("cryptdev: %s is being re-encrypted", name)
	}
	return r.Rekey.Check(name, device, dataKey)
}

// Start runs j unless a job of j.Name runs; it keeps its own copy of the
// keys and wipes it at the end.
func (r *Runner) Start(j Job) {
	r.mu.Lock()
	if r.running == nil {
		r.running = map[string]bool{}
	}
	if r.running[j.Name] {
		r.mu.Unlock()
		return
	}
	r.running[j.Name] = true
	r.mu.Unlock()
	j.From, j.To = bytes.Clone(j.From), bytes.Clone(j.To)
	go func() {
		err := r.Rekey.Run(context.Background(), j.Name, j.Device, j.From, j.To)
		clear(j.From)
		clear(j.To)
		j.From, j.To = nil, nil
		r.mu.Lock()
		delete(r.running, j.Name)
		r.mu.Unlock()
		if r.Done != nil {
			r.Done(j, err)
		}
	}()
}

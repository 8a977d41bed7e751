package audit_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
)

// FuzzDecodeEntry: the decoder never panics, and whatever it accepts
// re-encodes to exactly the same bytes (one encoding per entry).
func FuzzDecodeEntry(f *testing.F) {
	for i := 0; i < 5; i++ {
		e := sampleEntry(i)
		b, _ := e.Encode()
		f.Add(b)
	}
	f.Add([]byte(`{"kind":"deny","time":"2026-12-01T09:00:00.000000000Z","v":1}`))
	f.Add([]byte(`{"change":{"digest":"sha256:` + strings.Repeat("0a", 32) + `","revision":7},"kind":"state_change","time":"2026-12-01T09:00:00.000000000Z","v":2}`))
	f.Add([]byte(`{"detail":"a\u0001\b\t\n\f\r\"\\é","kind":"x","time":"0001-01-01T00:00:00.000000000Z","v":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := audit.DecodeEntry(data)
		if err != nil {
			if !errors.Is(err, audit.ErrMalformedEntry) {
				t.Fatalf("error does not wrap ErrMalformedEntry: %v", err)
			}
			return
		}
		again, err := e.Encode()
		if errors.Is(err, audit.ErrKeyMaterial) {
			return // readable in a log, refused for new appends
		}
		if err != nil {
			t.Fatalf("decoded entry does not encode: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("not canonical:\n in %q\nout %q", data, again)
		}
	})
}

// FuzzParseCheckpoint: the checkpoint and note parsers never panic, an
// accepted body re-serializes to the signed text, and nothing verifies
// without the key.
func FuzzParseCheckpoint(f *testing.F) {
	l, _ := newLog(f)
	appendN(f, l, 0, 3)
	cp, err := l.Checkpoint(context.Background())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cp.Note)
	f.Add([]byte("o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\next\n\n— o AAAAAAA=\n"))
	keys := []attest.PublicKey{testSigner(f, "key-v1", 1).PublicKey()}
	f.Fuzz(func(t *testing.T, msg []byte) {
		c, err := audit.ParseCheckpoint(msg)
		if err == nil {
			text := string(msg[:bytes.LastIndex(msg, []byte("\n\n"))+1])
			if c.Body() != text {
				t.Fatalf("body %q does not round-trip to %q", c.Body(), text)
			}
		}
		if c2, _, err := audit.OpenCheckpoint(msg, keys); err == nil && !bytes.Equal(msg, cp.Note) {
			// Only a note signed by the key verifies; a fuzzer cannot sign.
			if c2.Size != cp.Size || c2.Hash != cp.Hash {
				t.Fatalf("forged checkpoint verified: %+v", c2)
			}
		}
	})
}

// FuzzExportReader feeds arbitrary bytes to the export reader as an entry
// bundle and as a hash tile of a real export, and arbitrary tile paths to
// the path parser: no panic, and any change is reported.
func FuzzExportReader(f *testing.F) {
	ctx := context.Background()
	l, _ := newLog(f)
	appendN(f, l, 0, 20)
	if _, err := l.Checkpoint(ctx); err != nil {
		f.Fatal(err)
	}
	src := filepath.Join(f.TempDir(), "export")
	if _, err := l.Export(ctx, src, 0); err != nil {
		f.Fatal(err)
	}
	keys := []attest.PublicKey{testSigner(f, "key-v1", 1).PublicKey()}
	bundlePath := audit.EntryBundlePath(0, 20)
	tilePath := audit.HashTilePath(0, 0, 20)
	orig, _ := os.ReadFile(filepath.Join(src, filepath.FromSlash(bundlePath)))
	origTile, _ := os.ReadFile(filepath.Join(src, filepath.FromSlash(tilePath)))
	f.Add(orig, false, "tile/entries/x001/234.p/5")
	f.Add(origTile, true, "tile/0/000")
	f.Fuzz(func(t *testing.T, data []byte, asTile bool, path string) {
		if lv, n, w, err := audit.ParseTilePath(path); err == nil {
			var back string
			if lv < 0 {
				back = audit.EntryBundlePath(n, w)
			} else {
				back = audit.HashTilePath(uint(lv), n, w)
			}
			if back != path {
				t.Fatalf("tile path %q parsed to %d/%d/%d, prints %q", path, lv, n, w, back)
			}
		}
		dir := filepath.Join(t.TempDir(), "e")
		if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		target, same := bundlePath, bytes.Equal(data, orig)
		if asTile {
			target, same = tilePath, bytes.Equal(data, origTile)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(target)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := audit.Verify(ctx, dir, keys, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.OK() != same {
			t.Fatalf("changed=%v but OK=%v: %v", !same, r.OK(), r.Failures)
		}
		for _, x := range r.Failures {
			if x.Kind == "" || strings.TrimSpace(x.Detail) == "" {
				t.Fatalf("unnamed failure %+v", x)
			}
		}
	})
}

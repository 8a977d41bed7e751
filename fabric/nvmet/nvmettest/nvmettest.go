// Package nvmettest helps tests read what the nvmet driver wrote.
package nvmettest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Dump renders the tree under root, one line per entry in walk order:
// directories ("d"), files with mode and quoted content ("f"), and links
// with their target relative to the link ("l"; the driver makes absolute
// links, as configfs needs them).
func Dump(t testing.TB, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			if filepath.IsAbs(target) {
				target, _ = filepath.Rel(filepath.Dir(p), target)
			}
			fmt.Fprintf(&b, "l %s -> %s\n", rel, target)
		case d.IsDir():
			fmt.Fprintf(&b, "d %s\n", rel)
		default:
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, "f %s %04o %q\n", rel, info.Mode().Perm(), string(data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

//go:build !linux

package identity

import "os"

// ctimeNano is not implemented outside Linux; inode, size and mtime remain.
func ctimeNano(os.FileInfo) int64 { return 0 }

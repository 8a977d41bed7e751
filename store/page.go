package store

import (
	"bytes"
	"encoding/base64"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// Page sizes.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Page selects one page of a listing.
type Page struct {
	// Size is the most records to return: 0 means DefaultPageSize, larger
	// than MaxPageSize means MaxPageSize, negative is EINVALID.
	Size int
	// Token is the next-page token of the previous page, "" for the first.
	// Tokens are opaque to callers.
	Token string
}

// A page token is base64url (unpadded) of
//
//	tokenVersion | kind | last key
//
// where last key is the primary key of the last record of the previous page
// and kind names the listing, so that a token of one listing handed to
// another is refused instead of silently starting at an odd place. A listing
// resumes strictly after the last key, so records inserted or deleted
// between two calls never cause a record present throughout to be skipped
// or repeated. Tokens are not secret and not authenticated: a forged token
// only moves the starting point of a listing the caller may read anyway.
const tokenVersion = 1

// Listing kinds in page tokens.
const (
	kindTargets      byte = 't'
	kindSubsystems   byte = 's'
	kindNamespaces   byte = 'n'
	kindHostBindings byte = 'h'
	kindJobs         byte = 'j'
	kindGrants       byte = 'g'
)

// maxTokenKey bounds the key in a token: SPIFFE IDs may be 2048 bytes, NQNs
// 223; anything longer was not made by us.
const maxTokenKey = 4096

var tokenEncoding = base64.RawURLEncoding.Strict()

func encodeToken(kind byte, key []byte) string {
	if key == nil {
		return ""
	}
	b := make([]byte, 0, 2+len(key))
	b = append(b, tokenVersion, kind)
	return tokenEncoding.EncodeToString(append(b, key...))
}

// decodeToken returns the last key of a token made by encodeToken(kind, …),
// or nil for the empty token.
func decodeToken(kind byte, token string) ([]byte, error) {
	if token == "" {
		return nil, nil
	}
	if len(token) > tokenEncoding.EncodedLen(2+maxTokenKey) {
		return nil, badToken("is too long")
	}
	b, err := tokenEncoding.DecodeString(token)
	// The decoder skips CR and LF: re-encoding rejects such variants, so
	// that each position has exactly one token.
	if err != nil || tokenEncoding.EncodeToString(b) != token {
		return nil, badToken("is not a token from this listing")
	}
	if len(b) < 3 || b[0] != tokenVersion || b[1] != kind {
		return nil, badToken("is not a token from this listing")
	}
	key := b[2:]
	if kind == kindNamespaces {
		if _, _, ok := splitNamespaceKey(key); !ok {
			return nil, badToken("is not a token from this listing")
		}
	}
	return key, nil
}

func badToken(why string) error {
	return nvmegate.Invalid("page_token", "%s; pass the next_page_token of the previous page or none", why)
}

// parse returns the page size and the key to resume after.
func (p Page) parse(kind byte) (size int, after []byte, err error) {
	switch {
	case p.Size < 0:
		return 0, nil, nvmegate.Invalid("page_size", "must not be negative (got %d)", p.Size)
	case p.Size == 0:
		size = DefaultPageSize
	case p.Size > MaxPageSize:
		size = MaxPageSize
	default:
		size = p.Size
	}
	after, err = decodeToken(kind, p.Token)
	return size, after, err
}

// scanPage walks c in key order over the keys that start with prefix,
// beginning strictly after the key after (nil: at the start of prefix), and
// passes each entry to decode, which says whether it matches the listing's
// filter and, for a non-match, may return a key to seek to because no entry
// before it can match. It returns up to size matches and, if another match
// follows them, the cursor key of the last one returned (else nil).
//
// Looking one match ahead means that a listing ends with an empty token
// instead of an empty final page.
func scanPage[T any](c *bolt.Cursor, prefix, after []byte, size int, decode func(k, v []byte) (item T, ok bool, skipTo []byte, err error)) ([]T, []byte, error) {
	var k, v []byte
	switch {
	case after != nil && bytes.Compare(after, prefix) >= 0:
		k, v = c.Seek(after)
		if bytes.Equal(k, after) {
			k, v = c.Next()
		}
	case len(prefix) > 0:
		k, v = c.Seek(prefix)
	default:
		k, v = c.First()
	}
	items := make([]T, 0, min(size, 128))
	var last []byte
	for k != nil && bytes.HasPrefix(k, prefix) {
		item, ok, skipTo, err := decode(k, v)
		switch {
		case err != nil:
			return nil, nil, err
		case !ok && bytes.Compare(skipTo, k) > 0:
			k, v = c.Seek(skipTo)
			continue
		case !ok:
			k, v = c.Next()
			continue
		}
		if len(items) == size {
			// k is valid until the transaction ends; the token outlives it.
			return items, bytes.Clone(last), nil
		}
		items = append(items, item)
		last = k
		k, v = c.Next()
	}
	return items, nil, nil
}

// All collects every page of a listing: list is called with each page's
// token until the last page. For callers that need the whole set (warming
// caches at start, status of every key) rather than a page of it.
func All[T any](list func(p Page) ([]T, string, error)) ([]T, error) {
	var out []T
	p := Page{Size: MaxPageSize}
	for {
		items, next, err := list(p)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" {
			return out, nil
		}
		p.Token = next
	}
}

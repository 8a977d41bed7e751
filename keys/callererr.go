package keys

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nvmegate/nvmegate"
)

// CallerError maps a key store error to a domain error whose message a
// caller may see (never a backend's own text, which can name paths and
// mounts); other errors are wrapped and stay internal.
func CallerError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrUnavailable):
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "key store unavailable; retry later")
	case errors.Is(err, ErrConflict):
		return nvmegate.Errorf(nvmegate.ECONFLICT, "the key was rotated concurrently by another gateway; see Keys.Status")
	case errors.Is(err, ErrForeign):
		// Names and record IDs only: nothing of a key.
		return nvmegate.Errorf(nvmegate.ECONFLICT, "%s", strings.TrimPrefix(err.Error(), "keys: "))
	case errors.Is(err, ErrNotFound):
		return nvmegate.Errorf(nvmegate.ENOTFOUND, "no such key")
	}
	return fmt.Errorf("keys: %w", err)
}

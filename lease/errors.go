package lease

import (
	"errors"
	"fmt"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys"
)

// ErrUnrecorded (EUNAVAILABLE) is returned when a step's entry could not
// be made durable: nothing was changed, and the caller may retry later.
var ErrUnrecorded = nvmegate.Errorf(nvmegate.EUNAVAILABLE, "audit log unavailable: nothing was changed; retry later")

// keyErr maps key-store errors to domain errors with caller-safe messages.
func keyErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, keys.ErrUnavailable):
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "key store unavailable; retry later")
	case errors.Is(err, keys.ErrConflict):
		return nvmegate.Errorf(nvmegate.ECONFLICT, "the key was rotated concurrently by another gateway; see Keys.Status")
	case errors.Is(err, keys.ErrNotFound):
		return nvmegate.Errorf(nvmegate.ENOTFOUND, "no such key")
	}
	return fmt.Errorf("keys: %w", err)
}

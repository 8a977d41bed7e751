package lease

import (
	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys"
)

// ErrUnrecorded (EUNAVAILABLE) is returned when a step's entry could not
// be made durable: nothing was changed, and the caller may retry later.
var ErrUnrecorded = nvmegate.Errorf(nvmegate.EUNAVAILABLE, "audit log unavailable: nothing was changed; retry later")

// keyErr maps key-store errors to domain errors with caller-safe messages.
var keyErr = keys.CallerError

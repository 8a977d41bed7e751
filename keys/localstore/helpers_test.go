package localstore_test

import "time"

func t0() time.Time { return time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC) }

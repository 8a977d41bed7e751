package nvmegate

import (
	"strconv"
	"strings"
)

// WithholdQuoted replaces each double-quoted Go string literal in msg (and
// the "…" show appends to a cut one) with "…"; at a quote that opens no
// literal the rest of msg is withheld. Validation messages quote what the
// caller sent (show); this is what they may say where the caller's values
// must not go — audit entries, log lines: a field may hold a key pasted by
// mistake in a form LooksLikeKeyMaterial does not know.
func WithholdQuoted(msg string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(msg, '"')
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		b.WriteString(msg[:i])
		b.WriteString(`"…"`)
		q, err := strconv.QuotedPrefix(msg[i:])
		if err != nil {
			return b.String()
		}
		msg = strings.TrimPrefix(msg[i+len(q):], "…")
	}
}

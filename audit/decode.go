package audit

import (
	"fmt"
	"time"
	"unicode/utf8"
	"unsafe"
)

// DecodeEntry parses an encoded entry and checks that it is in canonical
// form: the only bytes Encode could have produced for the decoded value
// (sorted keys, no whitespace, canonical escapes and numbers, no empty
// optional members, schema version 1). So a decoded entry re-encodes to
// exactly data, and two different byte strings never decode to the same
// entry. It does not check key material or kinds (see Entry.Validate): a
// verifier must be able to read every entry that is in a log.
func DecodeEntry(data []byte) (Entry, error) {
	var e Entry
	if len(data) > MaxEntrySize {
		return e, fmt.Errorf("%w: %d bytes", ErrMalformedEntry, len(data))
	}
	d := decoder{b: data}
	err := d.entry(&e)
	if err == nil && d.i != len(d.b) {
		err = d.errf("trailing data")
	}
	if err != nil {
		return Entry{}, err
	}
	return e, nil
}

type decoder struct {
	b []byte
	i int
	// view makes strings without escapes point into b instead of being
	// copied, and reuses the scratch entry's slices: for validating many
	// entries (Verify) without allocating. The values are then valid only
	// while b is.
	view bool
}

// validateEntry checks that data is a canonical entry like DecodeEntry,
// decoding into scratch (reused between calls) without copying strings.
func validateEntry(data []byte, scratch *Entry) error {
	if len(data) > MaxEntrySize {
		return fmt.Errorf("%w: %d bytes", ErrMalformedEntry, len(data))
	}
	dec := scratch.Decision
	ns, keys := scratch.Namespaces[:0], scratch.Keys[:0]
	*scratch = Entry{Namespaces: ns, Keys: keys}
	if dec != nil {
		*dec = Decision{Reasons: dec.Reasons[:0]}
		scratch.Decision = dec
	}
	d := decoder{b: data, view: true}
	err := d.entry(scratch)
	if err == nil && d.i != len(d.b) {
		err = d.errf("trailing data")
	}
	return err
}

func (d *decoder) errf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrMalformedEntry, d.i, fmt.Sprintf(format, args...))
}

// plain marks the bytes a string may contain as themselves (no escape,
// not the closing quote, ASCII).
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// char consumes the single byte c.
func (d *decoder) char(c byte) error {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return nil
	}
	return d.errf("want %q", c)
}

func (d *decoder) lit(s string) error {
	if len(d.b)-d.i < len(s) || string(d.b[d.i:d.i+len(s)]) != s {
		return d.errf("want %q", s)
	}
	d.i += len(s)
	return nil
}

func (d *decoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// object parses {"k":v,...} with keys in strictly increasing order, calling
// member for each key with the decoder positioned at the value.
func (d *decoder) object(member func(key string) error) error {
	if err := d.char('{'); err != nil {
		return err
	}
	if d.peek() == '}' {
		d.i++
		return nil
	}
	prev := ""
	for n := 0; ; n++ {
		k, err := d.str()
		if err != nil {
			return err
		}
		if n > 0 && k <= prev {
			return d.errf("key %q out of order or repeated", k)
		}
		prev = k
		if err := d.char(':'); err != nil {
			return err
		}
		if err := member(k); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.errf("want , or }")
		}
	}
}

// array parses [v,...] calling elem for each element.
func (d *decoder) array(elem func() error) error {
	if err := d.char('['); err != nil {
		return err
	}
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.errf("want , or ]")
		}
	}
}

// str parses a string in exactly the escaping Encode writes.
func (d *decoder) str() (string, error) {
	if err := d.char('"'); err != nil {
		return "", err
	}
	var out []byte
	start := d.i
	for {
		for d.i < len(d.b) && plain[d.b[d.i]] {
			d.i++
		}
		if d.i >= len(d.b) {
			return "", d.errf("unterminated string")
		}
		c := d.b[d.i]
		switch {
		case c == '"':
			var s string
			switch {
			case out == nil && d.view && d.i > start:
				s = unsafe.String(&d.b[start], d.i-start)
			case out == nil:
				s = string(d.b[start:d.i])
			default:
				s = string(append(out, d.b[start:d.i]...))
			}
			d.i++
			if len(s) > maxField {
				return "", d.errf("string of %d bytes", len(s))
			}
			return s, nil
		case c < 0x20:
			return "", d.errf("raw control character")
		case c == '\\':
			out = append(out, d.b[start:d.i]...)
			if d.i+1 >= len(d.b) {
				return "", d.errf("unterminated escape")
			}
			switch e := d.b[d.i+1]; e {
			case '"', '\\':
				out = append(out, e)
				d.i += 2
			case 'b':
				out = append(out, '\b')
				d.i += 2
			case 't':
				out = append(out, '\t')
				d.i += 2
			case 'n':
				out = append(out, '\n')
				d.i += 2
			case 'f':
				out = append(out, '\f')
				d.i += 2
			case 'r':
				out = append(out, '\r')
				d.i += 2
			case 'u':
				// Only \u00xx with lower-case hex for the control
				// characters that have no short escape.
				if d.i+6 > len(d.b) || d.b[d.i+2] != '0' || d.b[d.i+3] != '0' {
					return "", d.errf("non-canonical \\u escape")
				}
				hi, ok1 := unhex(d.b[d.i+4])
				lo, ok2 := unhex(d.b[d.i+5])
				r := hi<<4 | lo
				if !ok1 || !ok2 || hi > 1 || r == '\b' || r == '\t' || r == '\n' || r == '\f' || r == '\r' {
					return "", d.errf("non-canonical \\u escape")
				}
				out = append(out, r)
				d.i += 6
			default:
				return "", d.errf("non-canonical escape")
			}
			start = d.i
		case c < utf8.RuneSelf:
			d.i++
		default:
			r, size := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && size <= 1 {
				return "", d.errf("invalid UTF-8")
			}
			d.i += size
		}
	}
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// nonEmpty parses a string that must not be empty (an optional member is
// omitted rather than written empty).
func (d *decoder) nonEmpty() (string, error) {
	s, err := d.str()
	if err == nil && s == "" {
		err = d.errf("empty optional string")
	}
	return s, err
}

// uint parses a canonical unsigned integer (no sign, no leading zero, no
// fraction or exponent) no larger than max.
func (d *decoder) uint(max uint64) (uint64, error) {
	start := d.i
	var v uint64
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		digit := uint64(d.b[d.i] - '0')
		if v > (max-digit)/10 {
			return 0, d.errf("number out of range")
		}
		v = v*10 + digit
		d.i++
	}
	switch n := d.i - start; {
	case n == 0:
		return 0, d.errf("want a number")
	case n > 1 && d.b[start] == '0':
		return 0, d.errf("leading zero")
	}
	return v, nil
}

func (d *decoder) boolean() (bool, error) {
	switch {
	case d.lit("true") == nil:
		return true, nil
	case d.lit("false") == nil:
		return false, nil
	}
	return false, d.errf("want true or false")
}

func (d *decoder) time() (time.Time, error) {
	s, err := d.str()
	if err != nil {
		return time.Time{}, err
	}
	t, ok := parseCanonicalTime(s)
	if !ok {
		return time.Time{}, d.errf("time not in %s form", timeLayout)
	}
	return t, nil
}

// parseCanonicalTime parses exactly timeLayout (UTC, 9 fraction digits,
// year 0001–9999) and refuses any value time.Date would normalize (month
// 13, February 30, second 60), so that each instant has one spelling.
func parseCanonicalTime(s string) (time.Time, bool) {
	if len(s) != len(timeLayout) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
		s[16] != ':' || s[19] != '.' || s[29] != 'Z' {
		return time.Time{}, false
	}
	num := func(a, b int) (int, bool) {
		v := 0
		for i := a; i < b; i++ {
			c := s[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	y, ok1 := num(0, 4)
	mo, ok2 := num(5, 7)
	dd, ok3 := num(8, 10)
	h, ok4 := num(11, 13)
	mi, ok5 := num(14, 16)
	se, ok6 := num(17, 19)
	ns, ok7 := num(20, 29)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) || y < 1 || mo < 1 || mo > 12 {
		return time.Time{}, false
	}
	t := time.Date(y, time.Month(mo), dd, h, mi, se, ns, time.UTC)
	if t.Year() != y || int(t.Month()) != mo || t.Day() != dd || t.Hour() != h || t.Minute() != mi || t.Second() != se {
		return time.Time{}, false
	}
	return t, true
}

func (d *decoder) entry(e *Entry) error {
	var haveKind, haveTime, haveV bool
	var version uint64
	err := d.object(func(k string) error {
		var err error
		switch k {
		case "caller":
			e.Caller, err = d.nonEmpty()
		case "change":
			e.Change = &ChangeRef{}
			err = d.change(e.Change)
		case "decision":
			if !d.view || e.Decision == nil {
				e.Decision = &Decision{}
			}
			err = d.decision(e.Decision)
		case "detail":
			e.Detail, err = d.nonEmpty()
		case "expires_at":
			e.ExpiresAt, err = d.time()
		case "grant_id":
			e.GrantID, err = d.nonEmpty()
		case "host_nqn":
			e.HostNQN, err = d.nonEmpty()
		case "job_id":
			e.JobID, err = d.nonEmpty()
		case "keys":
			err = d.array(func() error {
				var kr KeyRef
				err := d.keyRef(&kr)
				e.Keys = append(e.Keys, kr)
				return err
			})
			if err == nil && len(e.Keys) == 0 {
				err = d.errf("empty keys")
			}
		case "kind":
			var s string
			s, err = d.str()
			if err == nil && !validKindSyntax(s) {
				err = d.errf("kind %q", s)
			}
			e.Kind, haveKind = EventKind(s), true
		case "namespaces":
			err = d.array(func() error {
				var n Namespace
				err := d.namespace(&n)
				e.Namespaces = append(e.Namespaces, n)
				return err
			})
			if err == nil && len(e.Namespaces) == 0 {
				err = d.errf("empty namespaces")
			}
		case "subsystem_nqn":
			e.SubsystemNQN, err = d.nonEmpty()
		case "tenant":
			e.Tenant, err = d.nonEmpty()
		case "time":
			e.Time, err = d.time()
			haveTime = true
		case "v":
			var v uint64
			v, err = d.uint(maxJSONInt)
			if err == nil && (v < schemaV1 || v > SchemaVersion) {
				err = fmt.Errorf("%w: schema version %d (this reader knows %d to %d)", ErrMalformedEntry, v, schemaV1, SchemaVersion)
			}
			version, haveV = v, true
		default:
			err = d.errf("unknown member %q", k)
		}
		return err
	})
	if err != nil {
		return err
	}
	if !haveKind || !haveTime || !haveV {
		return fmt.Errorf("%w: kind, time and v are required", ErrMalformedEntry)
	}
	// One encoding per entry: version 2 exactly when a change is carried.
	if (e.Change != nil) != (version == SchemaVersion) {
		return fmt.Errorf("%w: version %d with%s a change", ErrMalformedEntry, version, map[bool]string{true: "", false: "out"}[e.Change != nil])
	}
	return nil
}

func validKindSyntax(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c == '_' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// fixed parses an object whose members are exactly names, in order.
func (d *decoder) fixed(names []string, member func(i int) error) error {
	i := 0
	err := d.object(func(k string) error {
		if i >= len(names) || k != names[i] {
			return d.errf("unexpected member %q", k)
		}
		i++
		return member(i - 1)
	})
	if err == nil && i != len(names) {
		err = d.errf("missing members (want %v)", names)
	}
	return err
}

var (
	changeNames    = []string{"digest", "revision"}
	decisionNames  = []string{"allow", "id", "policy_revision", "reasons"}
	keyRefNames    = []string{"class", "fingerprint", "id", "version"}
	namespaceNames = []string{"dataset", "dataset_digest", "mode", "nsid", "subsystem_nqn"}
)

func (d *decoder) decision(x *Decision) error {
	return d.fixed(decisionNames, func(i int) error {
		var err error
		switch i {
		case 0:
			x.Allow, err = d.boolean()
		case 1:
			x.ID, err = d.str()
		case 2:
			x.PolicyRevision, err = d.str()
		case 3:
			err = d.array(func() error {
				s, err := d.str()
				x.Reasons = append(x.Reasons, s)
				return err
			})
		}
		return err
	})
}

func (d *decoder) change(x *ChangeRef) error {
	return d.fixed(changeNames, func(i int) error {
		var err error
		switch i {
		case 0:
			if x.Digest, err = d.str(); err == nil && !validDigest(x.Digest) {
				err = d.errf("change digest %q", x.Digest)
			}
		case 1:
			x.Revision, err = d.uint(maxJSONInt)
		}
		return err
	})
}

func (d *decoder) keyRef(x *KeyRef) error {
	return d.fixed(keyRefNames, func(i int) error {
		var err error
		switch i {
		case 0:
			x.Class, err = d.str()
		case 1:
			x.Fingerprint, err = d.str()
		case 2:
			x.ID, err = d.str()
		case 3:
			x.Version, err = d.uint(maxJSONInt)
		}
		return err
	})
}

func (d *decoder) namespace(x *Namespace) error {
	return d.fixed(namespaceNames, func(i int) error {
		var err error
		switch i {
		case 0:
			x.Dataset, err = d.str()
		case 1:
			x.DatasetDigest, err = d.str()
		case 2:
			x.Mode, err = d.str()
		case 3:
			var v uint64
			v, err = d.uint(1<<32 - 1)
			x.NSID = uint32(v)
		case 4:
			x.SubsystemNQN, err = d.str()
		}
		return err
	})
}

package hostlist

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrTooMany is what Expand wraps when the expression names more hosts
// than its bound.
var ErrTooMany = errors.New("hostlist: too many hosts")

// ErrSyntax is what Expand wraps when the expression is malformed.
var ErrSyntax = errors.New("hostlist: malformed expression")

// maxDigits bounds a range's numbers: no host number has more.
const maxDigits = 18

// MaxLen bounds an expression: a hostlist of 100,000 hosts written out
// one by one fits, and nothing larger is read.
const MaxLen = 1 << 20

// Expand returns the hosts expr names, in order, each once. It fails with
// ErrSyntax if expr is malformed or names no host, and with ErrTooMany if
// it names more than max hosts.
func Expand(expr string, max int) ([]string, error) {
	if len(expr) > MaxLen {
		return nil, fmt.Errorf("%w: %d bytes (at most %d)", ErrTooMany, len(expr), MaxLen)
	}
	items, err := split(expr)
	if err != nil {
		return nil, err
	}
	var (
		out  []string
		seen = map[string]bool{}
		made int // names made, repeats included: the work is bounded by max
	)
	for _, item := range items {
		parts, err := parseItem(item)
		if err != nil {
			return nil, err
		}
		// The count is known before any name is made: an item past the
		// bound, or one that would take the names made past it (repeats
		// count: "a[1-100000],a[1-100000],…" is refused, not expanded
		// again and again), is refused at once.
		n := 1
		for _, p := range parts {
			if n = mulBounded(n, p.count(), max+1); n > max {
				return nil, fmt.Errorf("%w: %q names more than %d", ErrTooMany, item, max)
			}
		}
		if made += n; made > max {
			return nil, fmt.Errorf("%w: %q names more than %d, repeats included", ErrTooMany, expr, max)
		}
		err = product(parts, func(name string) error {
			if seen[name] {
				return nil
			}
			if len(out) == max {
				return fmt.Errorf("%w: %q names more than %d", ErrTooMany, expr, max)
			}
			seen[name] = true
			out = append(out, name)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %q names no host", ErrSyntax, expr)
	}
	return out, nil
}

// split cuts expr at the commas and white space outside brackets; empty
// items (",,") are skipped, as Slurm skips them.
func split(expr string) ([]string, error) {
	var (
		items []string
		depth int
		start int
	)
	for i := 0; i < len(expr); i++ {
		switch expr[i] {
		case '[':
			if depth > 0 {
				return nil, fmt.Errorf("%w: %q: a bracket inside a bracket at byte %d", ErrSyntax, expr, i)
			}
			depth++
		case ']':
			if depth == 0 {
				return nil, fmt.Errorf("%w: %q: ']' without '[' at byte %d", ErrSyntax, expr, i)
			}
			depth--
		case ',', ' ', '\t', '\n':
			if depth == 0 {
				if i > start {
					items = append(items, expr[start:i])
				}
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("%w: %q: '[' not closed", ErrSyntax, expr)
	}
	if len(expr) > start {
		items = append(items, expr[start:])
	}
	return items, nil
}

// A part of an item: fixed text, or a bracket group's ranges.
type part struct {
	text   string
	ranges []numRange // nil for text
}

type numRange struct {
	lo, hi uint64
	width  int // zero-padded to this many digits; 0: not padded
}

func (p part) count() int {
	if p.ranges == nil {
		return 1
	}
	n := 0
	for _, r := range p.ranges {
		n = addBounded(n, r.hi-r.lo+1)
	}
	return n
}

func addBounded(n int, k uint64) int {
	const limit = 1 << 40
	if k > limit || uint64(n)+k > limit {
		return limit
	}
	return n + int(k)
}

func mulBounded(a, b, limit int) int {
	if a == 0 || b == 0 {
		return 0
	}
	if a > limit/b {
		return limit
	}
	return a * b
}

// parseItem reads one item: text, then groups each followed by text;
// the last group may not be followed by text (Slurm refuses "a[1-2]-b").
func parseItem(item string) ([]part, error) {
	var parts []part
	rest := item
	for rest != "" {
		open := strings.IndexByte(rest, '[')
		if open < 0 {
			if len(parts) > 0 {
				return nil, fmt.Errorf("%w: %q: text %q after the last range", ErrSyntax, item, rest)
			}
			if err := checkName(item, rest); err != nil {
				return nil, err
			}
			return []part{{text: rest}}, nil
		}
		if open > 0 {
			if err := checkName(item, rest[:open]); err != nil {
				return nil, err
			}
			parts = append(parts, part{text: rest[:open]})
		}
		end := strings.IndexByte(rest, ']') // split checked it is there
		ranges, err := parseGroup(item, rest[open+1:end])
		if err != nil {
			return nil, err
		}
		parts = append(parts, part{ranges: ranges})
		rest = rest[end+1:]
	}
	return parts, nil
}

func checkName(item, s string) error {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: %q: %q is not allowed in a host name", ErrSyntax, item, c)
		}
	}
	return nil
}

// parseGroup reads "1-4,7,010-012".
func parseGroup(item, g string) ([]numRange, error) {
	if g == "" {
		return nil, fmt.Errorf("%w: %q: an empty range", ErrSyntax, item)
	}
	var out []numRange
	for _, r := range strings.Split(g, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		l, err := parseNum(item, lo)
		if err != nil {
			return nil, err
		}
		h, err := parseNum(item, hi)
		if err != nil {
			return nil, err
		}
		if h < l {
			return nil, fmt.Errorf("%w: %q: range %s ends before it starts", ErrSyntax, item, r)
		}
		nr := numRange{lo: l, hi: h}
		if len(lo) > 1 && lo[0] == '0' {
			nr.width = len(lo)
		}
		out = append(out, nr)
	}
	return out, nil
}

func parseNum(item, s string) (uint64, error) {
	if s == "" || len(s) > maxDigits {
		return 0, fmt.Errorf("%w: %q: %q is not a host number", ErrSyntax, item, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: %q: %q is not a host number", ErrSyntax, item, s)
		}
	}
	return strconv.ParseUint(s, 10, 64)
}

// product calls fn with every name of parts, the first group outermost.
func product(parts []part, fn func(string) error) error {
	var walk func(i int, prefix []byte) error
	walk = func(i int, prefix []byte) error {
		if i == len(parts) {
			return fn(string(prefix))
		}
		p := parts[i]
		if p.ranges == nil {
			return walk(i+1, append(prefix, p.text...))
		}
		for _, r := range p.ranges {
			for n := r.lo; ; n++ {
				name := prefix
				if r.width > 0 {
					s := strconv.FormatUint(n, 10)
					for k := len(s); k < r.width; k++ {
						name = append(name, '0')
					}
					name = append(name, s...)
				} else {
					name = strconv.AppendUint(name, n, 10)
				}
				if err := walk(i+1, name); err != nil {
					return err
				}
				if n == r.hi {
					break
				}
			}
		}
		return nil
	}
	return walk(0, make([]byte, 0, 64))
}

package main

import (
	"bytes"
	"strings"
	"testing"
)

// A value with control, format or separator characters cannot shift a
// table's columns, add a row or reorder its text: it is shown quoted.
func TestTableQuotesInvisibleCharacters(t *testing.T) {
	var out bytes.Buffer
	a := newApp(&out, &out)
	a.output = "table"
	rows := [][]string{
		{"nqn.2026-01.io.example:a", "plain text, é 東京"},
		{"nqn.2026-01.io.example:b", "acme \u202egniniart"},
		{"nqn.2026-01.io.example:c", "one\ttwo\nnqn.2026-01.io.example:forged\tx"},
		{"nqn.2026-01.io.example:d", "next\u0085line\u2028sep\u200bzw"},
		{"nqn.2026-01.io.example:e", "acme\u3164\ufe0f"},
	}
	if err := a.print(nil, []string{"NQN", "DESCRIPTION"}, rows); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, r := range []string{"\u202e", "\t", "\u0085", "\u2028", "\u200b", "\u3164", "\ufe0f"} {
		if strings.Contains(got, r) {
			t.Errorf("table holds %q:\n%s", r, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 6 {
		t.Errorf("%d lines, want 6 (header and 5 rows):\n%s", n, got)
	}
	for _, want := range []string{"plain text, é 東京", `"acme \u202egniniart"`, `"one\ttwo\nnqn.2026-01.io.example:forged\tx"`, `"acme\u3164\ufe0f"`} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %s:\n%s", want, got)
		}
	}
}

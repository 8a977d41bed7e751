package report

import (
	"cmp"
	"fmt"
	"html/template"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate/audit"
)

// Input is what a report shows.
type Input struct {
	// Title names the selection: "job llm-pretrain-1", "tenant acme,
	// 2026-12-01 – 2026-12-03".
	Title string
	// Verification is the offline verifier's report on the log the
	// records come from.
	Verification *audit.Report
	// Records are the selected entries, by index.
	Records []audit.Record
	// Now is the time the report is made (open grants end there).
	Now time.Time
}

// Bar is one grant on the timeline.
type Bar struct {
	Grant, Row        string
	Start, End        time.Time
	EndKind           string // release, revoke, expire, or "" (still active at Now)
	X, Y, W           float64
	Detail, EndDetail string
}

// Mark is one event drawn as a point: a refusal or a renewal deadline.
type Mark struct {
	Kind, Row, Detail string
	At                time.Time
	X, Y              float64
}

// model is what the template renders.
type model struct {
	Input
	OK                  bool
	Failures            []string
	Rows                []string
	Bars                []Bar
	Marks               []Mark
	Revisions, KeyVers  []string
	Attestations        []audit.Record
	Width, Height, Left float64
	Ticks               []tick
	Entries             []audit.Record
}

type tick struct {
	X     float64
	Label string
}

const (
	rowHeight = 22.0
	left      = 360.0 // the row labels
	plotWidth = 900.0
)

// HTML writes the report of in to w.
func HTML(w io.Writer, in Input) error {
	m := build(in)
	return page.Execute(w, m)
}

func build(in Input) *model {
	m := &model{Input: in, Left: left, Entries: in.Records}
	if v := in.Verification; v != nil {
		m.OK = v.OK()
		for _, f := range v.Failures {
			m.Failures = append(m.Failures, f.Error())
		}
	}
	bars := map[string]*Bar{}
	var order []string
	revs, keys := map[string]bool{}, map[string]bool{}
	first, last := in.Now, time.Time{}
	for _, r := range in.Records {
		e := r.Entry
		if e.Time.Before(first) {
			first = e.Time
		}
		if e.Time.After(last) {
			last = e.Time
		}
		if d := e.Decision; d != nil && d.PolicyRevision != "" {
			revs[d.PolicyRevision] = true
		}
		for _, k := range e.Keys {
			keys[fmt.Sprintf("%s %s v%d (%s)", k.Class, k.ID, k.Version, k.Fingerprint)] = true
		}
		row := rowOf(e)
		switch e.Kind {
		case audit.EventGrant:
			if e.GrantID == "" {
				continue
			}
			b := &Bar{Grant: e.GrantID, Row: row, Start: e.Time, End: e.ExpiresAt, Detail: fmt.Sprintf("grant %s at index %d", e.GrantID, r.Index)}
			bars[e.GrantID] = b
			order = append(order, e.GrantID)
		case audit.EventRenew:
			if b := bars[e.GrantID]; b != nil {
				if e.ExpiresAt.After(b.End) {
					b.End = e.ExpiresAt
				}
				m.Marks = append(m.Marks, Mark{Kind: "renew", Row: b.Row, At: e.Time, Detail: fmt.Sprintf("grant %s renewed until %s", e.GrantID, e.ExpiresAt.UTC().Format(time.RFC3339))})
			}
		case audit.EventRelease, audit.EventRevoke, audit.EventExpire:
			if b := bars[e.GrantID]; b != nil && b.EndKind == "" {
				b.End, b.EndKind, b.EndDetail = e.Time, string(e.Kind), e.Detail
			}
		case audit.EventDeny, audit.EventReauth:
			if b := bars[e.GrantID]; b != nil && e.GrantID != "" {
				row = b.Row // about a grant: on its node's row, whoever recorded it
			}
			m.Marks = append(m.Marks, Mark{Kind: string(e.Kind), Row: row, At: e.Time, Detail: e.Detail})
		case audit.EventComplianceAttestation:
			m.Attestations = append(m.Attestations, r)
		}
	}
	for _, id := range order {
		b := bars[id]
		if b.EndKind == "" && (b.End.IsZero() || b.End.After(in.Now)) {
			b.End = in.Now // still active
		}
		if b.End.After(last) {
			last = b.End
		}
		m.Bars = append(m.Bars, *b)
	}
	if !last.After(first) {
		last = first.Add(time.Minute)
	}
	rows := map[string]bool{}
	for _, b := range m.Bars {
		rows[b.Row] = true
	}
	for _, k := range m.Marks {
		rows[k.Row] = true
	}
	m.Rows = slices.Sorted(maps.Keys(rows))
	rowY := map[string]float64{}
	for i, r := range m.Rows {
		rowY[r] = 30 + float64(i)*rowHeight
	}
	span := last.Sub(first).Seconds()
	x := func(t time.Time) float64 { return left + plotWidth*t.Sub(first).Seconds()/span }
	for i := range m.Bars {
		b := &m.Bars[i]
		b.X, b.Y, b.W = x(b.Start), rowY[b.Row]+3, max(2, x(b.End)-x(b.Start))
	}
	for i := range m.Marks {
		k := &m.Marks[i]
		k.X, k.Y = x(k.At), rowY[k.Row]+rowHeight/2
	}
	slices.SortFunc(m.Marks, func(a, b Mark) int { return a.At.Compare(b.At) })
	layout := "01-02 15:04:05"
	if last.Sub(first) < 2*time.Minute {
		layout = "15:04:05.000" // a short span: the seconds alone would repeat
	}
	for i := 0; i <= 4; i++ {
		t := first.Add(time.Duration(float64(last.Sub(first)) * float64(i) / 4))
		m.Ticks = append(m.Ticks, tick{X: x(t), Label: t.UTC().Format(layout)})
	}
	m.Width, m.Height = left+plotWidth+60, 50+float64(max(1, len(m.Rows)))*rowHeight
	m.Revisions = slices.Sorted(maps.Keys(revs))
	m.KeyVers = slices.Sorted(maps.Keys(keys))
	return m
}

// rowOf is an entry's row: its node (the caller) and the datasets it
// concerns (else its subsystem).
func rowOf(e audit.Entry) string {
	who := cmp.Or(e.Caller, "(gateway)")
	var ds []string
	for _, n := range e.Namespaces {
		if n.Dataset != "" && n.Mode != "" && !slices.Contains(ds, n.Dataset) {
			ds = append(ds, n.Dataset)
		}
	}
	switch {
	case len(ds) > 0:
		slices.Sort(ds)
		return who + " → " + strings.Join(ds, ", ")
	case e.SubsystemNQN != "":
		return who + " → " + e.SubsystemNQN
	}
	return who
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"ts":    func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"short": func(s string) string { return shorten(s, 60) },
	"f":     func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"add":   func(a, b float64) float64 { return a + b },
	"mul":   func(i int) float64 { return float64(i) * rowHeight },
}).Parse(tmpl))

func shorten(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

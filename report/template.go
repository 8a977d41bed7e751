package report

// tmpl is the page: one file, inline CSS and SVG, no script.
const tmpl = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>nvmegate audit report: {{.Title}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; }
h1 { font-size: 20px; margin: 0 0 12px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
.verdict { padding: 12px 16px; border-radius: 6px; margin-bottom: 16px; }
.ok { background: #e6f4ea; border: 1px solid #8cc7a0; }
.failed { background: #fde8e8; border: 1px solid #e29a9a; }
table { border-collapse: collapse; }
td, th { padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
code { font-size: 12px; }
svg text { font: 11px system-ui, sans-serif; fill: #1d2330; }
rect.grant { fill: #4c7bd9; }
rect.grant.revoke { fill: #d9534c; }
rect.grant.expire { fill: #9aa3b5; }
rect.grant.open { fill: #47a36b; }
circle.deny { fill: #d9534c; }
circle.reauth_required { fill: #e0a030; }
circle.renew { fill: #ffffff; stroke: #1d2330; stroke-width: 1.5; }
line.tick { stroke: #d5d9e2; }
.legend span { display: inline-block; margin-right: 16px; }
.sw { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }
</style>
</head>
<body>
<h1>Audit report: {{.Title}}</h1>
<section id="verification" class="verdict {{if .OK}}ok{{else}}failed{{end}}">
{{with .Verification}}
<strong id="verdict">{{if $.OK}}Verified{{else}}NOT VERIFIED{{end}}</strong>:
log <code>{{.Origin}}</code>, tree size <span id="tree-size">{{.TreeSize}}</span>, root hash <code>{{.RootHash}}</code>,
{{.Entries}} entries and {{.Checkpoints}} checkpoints checked,
signed by {{range .SignedBy}}<code>{{.Algorithm}} v{{.Version}} {{.KeyID}}</code> {{end}}
{{else}}<strong id="verdict">NOT VERIFIED</strong>: no verification was made{{end}}
{{range .Failures}}<div class="failure">{{.}}</div>{{end}}
</section>

<h2>Timeline</h2>
<div class="legend">
<span><i class="sw" style="background:#47a36b"></i>active</span>
<span><i class="sw" style="background:#4c7bd9"></i>released</span>
<span><i class="sw" style="background:#d9534c"></i>revoked</span>
<span><i class="sw" style="background:#9aa3b5"></i>expired</span>
<span><i class="sw" style="background:#d9534c;border-radius:6px"></i>refusal</span>
<span><i class="sw" style="background:#e0a030;border-radius:6px"></i>must renew</span>
<span><i class="sw" style="background:#fff;border:1.5px solid #1d2330;border-radius:6px"></i>renewal</span>
</div>
<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{{f .Width}}" height="{{f .Height}}" role="img" aria-label="grants over time">
{{range .Ticks}}<line class="tick" x1="{{f .X}}" y1="20" x2="{{f .X}}" y2="{{f $.Height}}"/><text x="{{f .X}}" y="14" text-anchor="middle">{{.Label}}</text>
{{end}}{{range $i, $r := .Rows}}<text class="row" x="4" y="{{f (add 45 (mul $i))}}">{{short $r}}</text>
{{end}}{{range .Bars}}<rect class="grant {{if .EndKind}}{{.EndKind}}{{else}}open{{end}}" data-grant="{{.Grant}}" x="{{f .X}}" y="{{f .Y}}" width="{{f .W}}" height="16"><title>{{.Detail}}: {{ts .Start}} – {{ts .End}}{{if .EndKind}} ({{.EndKind}}{{if .EndDetail}}: {{.EndDetail}}{{end}}){{else}} (active){{end}}</title></rect>
{{end}}{{range .Marks}}<circle class="{{.Kind}}" cx="{{f .X}}" cy="{{f .Y}}" r="5"><title>{{.Kind}} at {{ts .At}}: {{.Detail}}</title></circle>
{{end}}</svg>

<h2>Policy revisions behind the decisions</h2>
<ul id="revisions">{{range .Revisions}}<li><code>{{.}}</code></li>{{else}}<li>none recorded</li>{{end}}</ul>

<h2>Key versions</h2>
<ul id="keys">{{range .KeyVers}}<li><code>{{.}}</code></li>{{else}}<li>none recorded</li>{{end}}</ul>

<h2>Compliance attestations of the period</h2>
<ul id="attestations">{{range .Attestations}}<li>index {{.Index}} at {{ts .Entry.Time}}: <code>{{.Entry.Detail}}</code></li>{{else}}<li>none recorded</li>{{end}}</ul>

<h2>Entries</h2>
<table id="entries">
<tr><th>index</th><th>time</th><th>kind</th><th>caller</th><th>grant</th><th>detail</th></tr>
{{range .Entries}}<tr><td>{{.Index}}</td><td>{{ts .Entry.Time}}</td><td>{{.Entry.Kind}}</td><td>{{.Entry.Caller}}</td><td>{{.Entry.GrantID}}</td><td>{{.Entry.Detail}}</td></tr>
{{end}}</table>
</body>
</html>
`

// Package report renders an auditor's report of the audit log as one
// self-contained HTML page (inline CSS and SVG, no external asset, no
// script): the verification result first — checkpoint, tree size, signer,
// what failed — then a timeline of the selected entries (one row per node
// and subsystem, one bar per grant from its grant entry to the entry that
// ended it or its expiry, markers for refusals and renewal deadlines), the
// policy revisions and key versions behind them, and the compliance
// attestations recorded in the period.
//
// It reads typed audit records (audit.Record) and an audit.Report from the
// offline verifier: nothing of the gateway, so a report made from an
// export is exactly as trustworthy as the export's verification, which it
// shows first.
package report

package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/nvmegate/nvmegate"
)

var jsonOpts = protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}

// print writes msg as JSON (-o json) or as a table of header and rows.
func (a *app) print(msg proto.Message, header []string, rows [][]string) error {
	if a.output == "json" {
		b, err := jsonOpts.Marshal(msg)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(a.stdout, string(b))
		return err
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = cell(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// cell is a value as a table shows it: quoted, with escapes
// (nvmegate.Quote), if it holds what the gateway refuses in new records
// (control, format, separator or default-ignorable characters, which would
// shift columns, start a new row, reorder the text around them or hide in
// it). The gateway refuses those, but a record stored by an
// older version, or a misbehaving server, could still carry them.
func cell(s string) string {
	if nvmegate.ValidateString("", s) != nil {
		return nvmegate.Quote(s)
	}
	return s
}

// printPage prints a listing and, in table form, how to get the next page.
func (a *app) printPage(msg proto.Message, header []string, rows [][]string, next string) error {
	if err := a.print(msg, header, rows); err != nil {
		return err
	}
	if next != "" && a.output != "json" {
		fmt.Fprintf(a.stderr, "more results: --page-token %s\n", next)
	}
	return nil
}

// done reports a change without a record to show.
func (a *app) done(msg proto.Message, text string) error {
	if a.output == "json" {
		return a.print(msg, nil, nil)
	}
	_, err := fmt.Fprintln(a.stdout, text)
	return err
}

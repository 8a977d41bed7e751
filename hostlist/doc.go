// Package hostlist expands Slurm hostlist expressions, such as
// "gpu[001-128,130],login1", into host names, in the order Slurm gives them
// (`scontrol show hostnames`).
//
// The grammar is Slurm's, made strict where Slurm is lenient:
//
//   - A list is items separated by commas (or white space) outside
//     brackets.
//   - An item is a host name, or a prefix followed by bracket groups, each
//     possibly followed by more text and another group: "rack[1-2]n[1-4]"
//     is the cartesian product, first group outermost, as Slurm expands it.
//   - A group is ranges separated by commas: "7" or "1-16", low ≤ high.
//     Numbers are zero-padded to the width of the low bound when it starts
//     with a zero ("[001-100]" gives 001 … 100; "[9-11]" gives 9, 10, 11).
//   - Text after the last group is refused, as Slurm refuses "a[1-2]-b".
//     So are unclosed brackets, spaces, and empty groups, which Slurm
//     expands into surprising names ("a[1-3" is "a]" to scontrol).
//
// Host names are letters, digits, '-', '_' and '.'; a repeated host is kept
// once, where it first appears. Expansion stops with an error past a
// caller's bound, so an expression like "n[0-999999999]" costs nothing.
package hostlist

// Package logbuf is a log sink for tests: a buffer that the goroutines of
// a gateway or daemon under test may write to while the test reads it.
package logbuf

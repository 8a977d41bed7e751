//go:build !linux

package keyring

import "errors"

var errNotLinux = errors.New("keyring: kernel keyrings exist on Linux only")

// NVMe is Linux only.
func NVMe() (*Ring, error) { return nil, errNotLinux }

// Named is Linux only.
func Named(string) (*Ring, error) { return nil, errNotLinux }

// Set is Linux only.
func (r *Ring) Set(string, []byte) (int, error) { return 0, errNotLinux }

// Remove is Linux only.
func (r *Ring) Remove(string) error { return errNotLinux }

// Lookup is Linux only.
func (r *Ring) Lookup(string) (int, error) { return 0, errNotLinux }

// List is Linux only.
func (r *Ring) List() (map[string]int, error) { return nil, errNotLinux }

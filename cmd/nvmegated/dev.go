package main

import (
	"time"

	"github.com/nvmegate/nvmegate/identity/devca"
)

// provisionDev creates (or refreshes) the dev trust domain in dir: the CA on
// first use, and new SVIDs for every dev identity at every start so they do
// not expire under a long-lived dev directory.
func provisionDev(dir string, now time.Time) error {
	return devca.Provision(dir, devca.DevIdentities, now)
}

// devDefaults fills what the dev mode implies and the user did not set.
func devDefaults(c *Config, dir string) {
	def := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	cert, key := devca.SVIDPaths(dir, "gateway")
	def(&c.TrustDomain, devca.DevTrustDomain)
	def(&c.StateDir, devca.StatePath(dir))
	def(&c.Identity.Cert, cert)
	def(&c.Identity.Key, key)
	def(&c.Identity.Bundle, devca.BundlePath(dir))
	def(&c.ReadyFile, devca.ReadyPath(dir))
}

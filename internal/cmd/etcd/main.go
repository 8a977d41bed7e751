// Command etcd is the etcd server (go.etcd.io/etcd/server/v3/etcdmain, at
// the version go.mod pins), built from this module for the e2e tier's
// real etcd processes: go's build cache keeps it once per machine.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

// Command etcd is etcd's own server entry point (the etcd binary's main), pinned by ../go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

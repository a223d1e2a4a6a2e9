// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3/etcdmain)
// at the version Kubernetes v1.37.2 pins, built here because Debian's
// etcd-server package (3.4) cannot answer the watch progress requests that
// client-go's streaming initial list needs: with it, every informer falls
// back to one big LIST, and the benchmark would measure that fallback
// instead of what a proxy holds on a real cluster (docs/benchmarks.md).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

// Command ipvsproxy is a Kubernetes service proxy that programs the
// kernel's IPVS load balancer incrementally. See the README.
package main

import (
	"os"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/app"
)

func main() {
	// 1 = failed (diff: different), 2 = usage error (diff: any error).
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr))
}

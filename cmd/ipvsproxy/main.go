// Command ipvsproxy is a Kubernetes service proxy that programs the
// kernel's IPVS load balancer incrementally. See the README.
package main

import (
	"os"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/app"
)

func main() {
	if err := app.NewCommand().Execute(); err != nil {
		os.Exit(app.ExitCode(err)) // diff: 1 = different, 2 = error
	}
}

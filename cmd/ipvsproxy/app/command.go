// Package app is the ipvsproxy command line: flags, validation and the
// wiring of informers, engine, kernel adapters and HTTP servers.
package app

import (
	"errors"
	"flag"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// version is set at build time with -ldflags -X.
var version = "dev"

// NewCommand returns the root command: `ipvsproxy [flags]` runs the proxy.
func NewCommand() *cobra.Command {
	o := NewOptions()
	var cleanupFlag bool
	cmd := &cobra.Command{
		Use:   "ipvsproxy",
		Short: "Kubernetes service proxy on the kernel's IPVS load balancer, incremental at any scale",
		Long: `ipvsproxy watches Services and EndpointSlices and programs kernel IPVS
virtual servers, the kube-ipvs0 dummy link, ipsets and a fixed set of
iptables rules, changing only what changed. It replaces kube-proxy's IPVS
mode and keeps its names, flags and metrics.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cleanupFlag && o.WriteConfigTo != "" {
				// kube-proxy writes the file and silently skips the
				// cleanup; an operator asking for both gets neither
				// and is told why.
				return usageError(cmd, errors.New("--cleanup and --write-config-to cannot be used together: --write-config-to only writes the configuration and exits; run them one after the other"))
			}
			cf, err := o.loadConfig(cmd.Flags())
			if err != nil {
				return fail(cmd, err)
			}
			if err := o.Validate(); err != nil {
				return fail(cmd, cf.Explain(err))
			}
			if o.WriteConfigTo != "" {
				return fail(cmd, o.writeConfig(cmd.Flags()))
			}
			if cleanupFlag { // kube-proxy's --cleanup
				return fail(cmd, runCleanup(o, cmd.OutOrStdout()))
			}
			return fail(cmd, Run(cmd.Context(), o))
		},
	}
	o.AddFlags(cmd.Flags())
	cmd.Flags().BoolVar(&cleanupFlag, "cleanup", false, "Remove everything ipvsproxy made on this node and exit (same as `ipvsproxy cleanup`).")
	gofs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gofs)
	// Persistent, so every subcommand takes the proxy's -v too.
	cmd.PersistentFlags().AddGoFlagSet(gofs)
	// Inherited by the subcommands.
	cmd.SetFlagErrorFunc(usageError)
	cmd.AddCommand(newCleanupCommand(), newDiffCommand(), newStatusCommand(), newPrepareNodeCommand())
	cmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "ipvsproxy %s (%s %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		},
	})
	return cmd
}

// fail prints err as one line on stderr and returns it, marked as told.
func fail(cmd *cobra.Command, err error) error {
	if err == nil {
		return nil
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "ipvsproxy: %v\n", err)
	return &reportedError{err}
}

// Package app is the ipvsproxy command line: flags, validation and the
// wiring of informers, engine, kernel adapters and HTTP servers.
package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
)

// Set at build time with -ldflags -X (see the Makefile).
var (
	version   = "dev"
	commit    = "unknown"
	buildDate = "unknown"
)

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
mode and accepts its flags, config file, metrics and logging flags.

It needs root, or CAP_NET_ADMIN and CAP_NET_RAW (the kernel settings at
start need a writable /proc/sys: see prepare-node).

Exit codes: 0 stopped by a signal or done, 1 failed (or the --config file
changed: the pod restarts with the new one), 2 the command line could not
be understood.`,
		Example: `  ipvsproxy --kubeconfig /var/lib/kube-proxy/kubeconfig.conf --cluster-cidr 10.244.0.0/16
  ipvsproxy --config /var/lib/kube-proxy/config.conf --hostname-override "$NODE_NAME"`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch o.compat.Version {
			case "true":
				printVersion(cmd.OutOrStdout())
				return nil
			case "raw":
				return fail(cmd, printRawVersion(cmd.OutOrStdout()))
			}
			if cleanupFlag && o.WriteConfigTo != "" {
				// kube-proxy writes the file and silently skips the
				// cleanup; an operator asking for both gets neither
				// and is told why.
				return usageError(cmd, errors.New("--cleanup and --write-config-to cannot be used together: --write-config-to only writes the configuration and exits; run them one after the other"))
			}
			if err := completeAndLog(o, cmd); err != nil {
				return fail(cmd, err)
			}
			switch {
			case o.WriteConfigTo != "":
				return fail(cmd, o.writeConfig())
			case cleanupFlag: // kube-proxy's --cleanup
				return fail(cmd, runCleanup(o, cmd.OutOrStdout()))
			case o.compat.InitOnly: // kube-proxy's --init-only
				return fail(cmd, runPrepareNode(o, cmd.OutOrStdout()))
			}
			return fail(cmd, Run(cmd.Context(), o))
		},
	}
	o.AddFlags(cmd.Flags())
	cmd.Flags().BoolVar(&cleanupFlag, "cleanup", false, "Remove everything ipvsproxy made on this node and exit (same as the cleanup command).")
	// Persistent, so every subcommand takes the proxy's -v too.
	addLoggingFlags(o.Logging, cmd.PersistentFlags())
	// Inherited by the subcommands.
	cmd.SetFlagErrorFunc(usageError)
	for _, tool := range []*cobra.Command{newCleanupCommand(o.Logging), newDiffCommand(o.Logging),
		newStatusCommand(o.Logging), newPrepareNodeCommand(o.Logging), newDoctorCommand(o.Logging)} {
		applyToolHelp(tool)
		cmd.AddCommand(tool)
	}
	cmd.AddCommand(newVersionCommand())
	// kube-proxy's: --hostname_override is --hostname-override.
	cmd.SetGlobalNormalizationFunc(cliflag.WordSepNormalizeFunc)
	return cmd
}

// completeAndLog completes the options, then sets up logging as they say
// (the config file may set it) and logs what Complete warned about.
func completeAndLog(o *Options, cmd *cobra.Command) error {
	if err := o.Complete(cmd.Flags()); err != nil {
		return err
	}
	if err := applyLogging(o.Logging); err != nil {
		return fmt.Errorf("logging: %w", err)
	}
	for _, w := range o.Warnings() {
		klog.Warning(w)
	}
	return nil
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version, commit and build date",
		Example: "  ipvsproxy version\n  ipvsproxy --version",
		Args:    noArgs,
		Run:     func(cmd *cobra.Command, _ []string) { printVersion(cmd.OutOrStdout()) },
	}
}

// printRawVersion is --version=raw: the same facts as JSON.
func printRawVersion(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(map[string]string{"version": version, "commit": commit, "buildDate": buildDate,
		"goVersion": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH})
}

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "ipvsproxy %s (commit %s, built %s, %s %s/%s)\n", version, commit, buildDate, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// fail prints err as one line on stderr and returns it, marked as told.
func fail(cmd *cobra.Command, err error) error {
	if err == nil {
		return nil
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "ipvsproxy: %v\n", err)
	return &reportedError{err}
}

// sharedLogging makes a subcommand's options use the root command's
// logging configuration, which the persistent logging flags fill.
func sharedLogging(o *Options, l *logsapi.LoggingConfiguration) { o.Logging = l }

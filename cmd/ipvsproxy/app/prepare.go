package app

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// newPrepareNodeCommand is `ipvsproxy prepare-node`: the kernel settings
// the proxy makes at start (kube-proxy's IPVS sysctls, strict ARP,
// conntrack sizing and timeouts), applied once and exited. The DaemonSet's
// short privileged init container runs it with the proxy's own flags, so
// the long-running container — which sees /proc/sys read-only — finds
// everything set and writes nothing. One implementation serves both.
func newPrepareNodeCommand(logging *logsapi.LoggingConfiguration) *cobra.Command {
	cmd, _ := toolCommand("prepare-node", "Apply the kernel settings ipvsproxy needs (sysctls, conntrack sizing) and exit; for a privileged init container", logging,
		func(cmd *cobra.Command, o *Options) error { return fail(cmd, runPrepareNode(o, cmd.OutOrStdout())) })
	return cmd
}

// runPrepareNode is prepare-node and the proxy's --init-only.
func runPrepareNode(o *Options, out io.Writer) error {
	if err := prepareNode(o, sysctl.New(), &sysctl.Proc{Root: hashsizeDir}, numCPU()); err != nil {
		return err
	}
	fmt.Fprintln(out, "node prepared")
	return nil
}

// prepareNode writes what Run would write at start, and nothing when the
// node already has it.
func prepareNode(o *Options, sc, hashsize sysctl.Interface, cpus int) error {
	if err := startupSysctls(sc, o.StrictARP); err != nil {
		return err
	}
	if err := o.Conntrack.apply(sc, hashsize, cpus); err != nil {
		return fmt.Errorf("conntrack settings: %w", err)
	}
	return nil
}

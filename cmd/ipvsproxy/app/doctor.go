package app

import (
	"net"
	"os"
	"path"
	"strings"

	"github.com/spf13/cobra"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/doctor"
	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

func newDoctorCommand(logging *logsapi.LoggingConfiguration) *cobra.Command {
	var output string
	cmd, _ := toolCommand("doctor", "Check this node for what ipvsproxy needs and what commonly goes wrong (exit 0 all well, 1 warnings or failures, 2 error)", logging,
		func(cmd *cobra.Command, o *Options) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			n, err := doctorNode(o)
			if err != nil {
				return &exitError{2, fail(cmd, err)}
			}
			checks := doctor.Run(n)
			if output == "json" {
				err = doctor.WriteJSON(cmd.OutOrStdout(), checks)
			} else {
				err = doctor.WriteText(cmd.OutOrStdout(), checks)
			}
			if err != nil {
				return &exitError{2, fail(cmd, err)}
			}
			if doctor.Worst(checks) != doctor.OK {
				return &exitError{code: 1}
			}
			return nil
		})
	cmd.Long = `Check this node for what ipvsproxy needs and what commonly goes wrong:
kernel version and modules, the iptables backend (with
--rules-backend=nftables: whether the kernel holds an inet nf_tables
table), the IPVS and conntrack
sysctls (conn_reuse_mode left at 0 on a 5.9+ kernel, strict ARP off while
load-balancer IPs are programmed), the conntrack table's use, ipvsproxy's
sets against their maxelem, the kube-ipvs0 addresses, and what
kube-router left behind. It only reads (the nftables probe writes a
table of its own and deletes it in the same transaction).

Exit codes: 0 all well, 1 a warning or a failure, 2 the checks could not run.`
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text (one line per check) or json.")
	return cmd
}

// doctorNode opens the node's real readers for the checks. A reader that
// cannot be opened (no ip_set module) is a failed check, not an error.
func doctorNode(o *Options) (doctor.Node, error) {
	dummy, err := dummyif.New(dummyif.DefaultLinkName)
	if err != nil {
		return doctor.Node{}, err
	}
	ours := map[string]bool{}
	for _, s := range owned.Sets(true, true) {
		ours[s.Name] = true
	}
	n := doctor.Node{
		KernelRelease: kernelRelease(),
		Module:        moduleLoaded,
		LinkExists:    func(name string) bool { _, err := net.InterfaceByName(name); return err == nil },
		Sysctl:        sysctl.New(),
		Dummy:         dummy,
		Backend: func() (string, error) {
			b, err := iptablesBackend(o)
			return string(b), err
		},
		Save: func(backend, table string) ([]byte, error) {
			r, err := iptables.NewExecRunner(iptables.IPv4, iptables.Backend(backend))
			if err != nil {
				return nil, err
			}
			return r.Save(table)
		},
		Scheduler: o.Scheduler,
		OwnedSet:  func(name string) bool { return ours[name] },
	}
	if o.RulesBackend == RulesBackendNFTables {
		n.NFTables = func() error { return nftrules.Probe() }
		table, err := nftrules.New(nftrules.DefaultConfig(true, true))
		if err != nil {
			return doctor.Node{}, err
		}
		n.Sets = table.IPSets()
		return n, nil
	}
	if sets, err := ipset.New(); err != nil {
		n.SetsErr = err
	} else {
		n.Sets = sets
	}
	return n, nil
}

// moduleLoaded reports whether a kernel module is loaded or built in:
// /sys/module has every loaded one, but a built-in one only when it has
// parameters, so modules.builtin is read too.
func moduleLoaded(name string) bool {
	if _, err := os.Stat("/sys/module/" + name); err == nil {
		return true
	}
	builtin, err := os.ReadFile("/lib/modules/" + kernelRelease() + "/modules.builtin")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(builtin), "\n") {
		if path.Base(l) == name+".ko" {
			return true
		}
	}
	return false
}

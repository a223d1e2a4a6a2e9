package app

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// toolHelp is what a subcommand's help says beyond its flags.
type toolHelp struct {
	example string
	// privileges is the line about what the command needs to run.
	privileges string
	// flags are the proxy flags the command reads. Every other proxy flag
	// is accepted, so the DaemonSet's command line (or its init
	// container's) can be passed as it is, but hidden from the help.
	flags []string
}

const rootNote = "Needs root, or CAP_NET_ADMIN (netlink writes to IPVS, ipsets, links, iptables) and CAP_NET_RAW."

var toolHelps = map[string]toolHelp{
	"cleanup": {
		example:    "  ipvsproxy cleanup --config /var/lib/kube-proxy/config.conf\n  ipvsproxy cleanup --ipvs-exclude-cidrs 192.168.50.0/24 --nodeport-addresses primary",
		privileges: rootNote,
		flags: []string{"config", "ipvs-exclude-cidrs", "nodeport-addresses", "bind-address", "iptables-backend",
			"iptables-masquerade-bit", "masquerade-all", "cluster-cidr", "rules-backend"},
	},
	"diff": {
		example:    "  ipvsproxy diff --kubeconfig /var/lib/kube-proxy/kubeconfig.conf --hostname-override \"$NODE_NAME\"\n  ipvsproxy diff --config /var/lib/kube-proxy/config.conf -o json",
		privileges: "Reads the kernel only; needs CAP_NET_ADMIN (IPVS and ipset reads are privileged) and the proxy's API credentials.",
		flags: []string{"config", "kubeconfig", "master", "hostname-override", "kube-api-qps", "kube-api-burst",
			"kube-api-content-type", "ipvs-scheduler", "ipvs-exclude-cidrs", "nodeport-addresses", "bind-address",
			"cluster-cidr", "detect-local-mode", "pod-bridge-interface", "pod-interface-name-prefix", "masquerade-all",
			"iptables-masquerade-bit", "iptables-backend", "rules-backend", "output"},
	},
	"status": {
		example:    "  ipvsproxy status\n  ipvsproxy status --config /var/lib/kube-proxy/config.conf",
		privileges: "Reads the kernel only; needs CAP_NET_ADMIN (IPVS and ipset reads are privileged).",
		flags:      []string{"config", "ipvs-exclude-cidrs", "nodeport-addresses", "bind-address", "iptables-backend", "rules-backend", "metrics-bind-address"},
	},
	"doctor": {
		example:    "  ipvsproxy doctor\n  ipvsproxy doctor --config /var/lib/kube-proxy/config.conf -o json",
		privileges: "Reads the kernel only; needs CAP_NET_ADMIN (IPVS and ipset reads are privileged).",
		flags:      []string{"config", "ipvs-scheduler", "ipvs-strict-arp", "iptables-backend", "rules-backend", "output"},
	},
	"prepare-node": {
		example:    "  ipvsproxy prepare-node --config /var/lib/kube-proxy/config.conf",
		privileges: "Needs root with a writable /proc/sys and /sys (a privileged container): that is why it is a separate step.",
		flags: []string{"config", "ipvs-strict-arp", "conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established",
			"conntrack-tcp-timeout-close-wait", "conntrack-udp-timeout", "conntrack-udp-timeout-stream", "conntrack-tcp-be-liberal"},
	},
}

// applyToolHelp adds the example and the privileges line to cmd's help
// and hides the flags it does not read.
func applyToolHelp(cmd *cobra.Command) {
	h := toolHelps[cmd.Name()]
	cmd.Example = h.example
	long := cmd.Long
	if long == "" {
		long = cmd.Short + "."
	}
	cmd.Long = long + "\n\n" + h.privileges
	shown := map[string]bool{}
	for _, f := range h.flags {
		shown[f] = true
	}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !shown[f.Name] {
			f.Hidden = true
		}
	})
}

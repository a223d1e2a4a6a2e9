package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/cleanup"
	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/nodewatch"
	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/inspect"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// exitError carries a process exit code other than 1 (diff: 1 = differs,
// 2 = error). err may be nil when there is nothing to print.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// ExitCode is the process exit code for an error returned by the command.
func ExitCode(err error) int {
	var e *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e.code
	}
	return 1
}

// toolCommand makes a subcommand that accepts every proxy flag (so the
// DaemonSet's command line and --config work unchanged) and runs do
// after the options are loaded and valid.
func toolCommand(use, short string, logging *logsapi.LoggingConfiguration, do func(cmd *cobra.Command, o *Options) error) (*cobra.Command, *Options) {
	o := NewOptions()
	sharedLogging(o, logging)
	cmd := &cobra.Command{
		Use:           use,
		Short:         short,
		Args:          noArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := completeAndLog(o, cmd); err != nil {
				return fail(cmd, err)
			}
			return do(cmd, o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd, o
}

func newCleanupCommand(logging *logsapi.LoggingConfiguration) *cobra.Command {
	cmd, _ := toolCommand("cleanup", "Remove everything ipvsproxy made on this node (virtual servers, kube-ipvs0 addresses, ipsets, iptables chains, the nftables table), and nothing else", logging,
		func(cmd *cobra.Command, o *Options) error { return fail(cmd, runCleanup(o, cmd.OutOrStdout())) })
	cmd.Long = cmd.Short + `.

Pass the flags the proxy runs with: ownership depends on them.
  - A virtual server is removed when its address is on kube-ipvs0, or
    ipvsproxy's sets name its IP and port, or it is a TCP/UDP node port
    (port in KUBE-NODE-PORT-*) on an address --nodeport-addresses selects
    now (with "primary", --bind-address or the default route's source);
    a node port left on an address the node no longer has is kept.
  - Nothing in --ipvs-exclude-cidrs is removed. kube-ipvs0 loses every
    other address, and is deleted only when no address is left on it.
  - Sets and iptables chains: only ipvsproxy's KUBE-* ones; the nftables
    table inet ipvsproxy whole. Both backends' objects are removed
    whichever --rules-backend is given; with --rules-backend=nftables a
    node without iptables tools is not searched for chains.`
	return cmd
}

func newDiffCommand(logging *logsapi.LoggingConfiguration) *cobra.Command {
	var output string
	cmd, _ := toolCommand("diff", "Print how the kernel differs from what the cluster wants (exit 0 equal, 1 different, 2 error)", logging,
		func(cmd *cobra.Command, o *Options) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			d, err := runDiff(cmd.Context(), o)
			if err != nil {
				return &exitError{2, fail(cmd, err)}
			}
			return diffResult(cmd, d, output)
		})
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text (ipvsadm/ipset/iptables/nft-like lines) or json.")
	cmd.Long = cmd.Short + `.

What the proxy would program is computed from the API server and the
flags given: pass the proxy's own, or its --config. The node-wide rules
compared (the iptables chains, or with --rules-backend=nftables the
chains, rules and set declarations of the table inet ` + nftrules.TableName + `)
depend on --rules-backend, --detect-local-mode (NodeCIDR: the Node's
spec.podCIDRs), --cluster-cidr, --pod-bridge-interface,
--pod-interface-name-prefix, --masquerade-all and
--iptables-masquerade-bit: a value other than the proxy's shows as drift.`
	return cmd
}

// diffResult prints d in the output format and is diff's exit: 0 equal,
// 1 different, 2 when it cannot be printed.
func diffResult(cmd *cobra.Command, d inspect.Diff, output string) error {
	var err error
	if output == "json" {
		err = d.WriteJSON(cmd.OutOrStdout())
	} else {
		err = d.WriteText(cmd.OutOrStdout())
	}
	if err != nil {
		return &exitError{2, fail(cmd, err)}
	}
	if !d.Equal() {
		return &exitError{code: 1}
	}
	return nil
}

func newStatusCommand(logging *logsapi.LoggingConfiguration) *cobra.Command {
	cmd, _ := toolCommand("status", "Show what is programmed on this node and, if a proxy runs, how its syncs go", logging,
		func(cmd *cobra.Command, o *Options) error {
			return fail(cmd, runStatus(cmd.Context(), o, cmd.OutOrStdout()))
		})
	return cmd
}

// checkOutput refuses an --output other than text or json (exit 2, as
// any error of diff and doctor).
func checkOutput(cmd *cobra.Command, output string) error {
	if output != "text" && output != "json" {
		return &exitError{2, fail(cmd, fmt.Errorf("--output %q: want text or json", output))}
	}
	return nil
}

// realKernel opens the kernel adapters the proxy and the tools read and
// write. With --rules-backend=nftables a node needs no ip_set module:
// without it there are no ipsets (of an earlier iptables backend) either.
func realKernel(o *Options) (owned.Kernel, func(), error) {
	h, err := ipvs.New()
	if err != nil {
		return owned.Kernel{}, nil, err
	}
	dummy, err := dummyif.New(dummyif.DefaultLinkName)
	if err != nil {
		h.Close()
		return owned.Kernel{}, nil, err
	}
	var sets ipset.Interface
	sets, err = ipset.New()
	if err != nil && o.RulesBackend == RulesBackendNFTables {
		klog.InfoS("No ipsets to look at", "err", err)
		sets, err = noIPSets{}, nil
	}
	if err != nil {
		h.Close()
		return owned.Kernel{}, nil, err
	}
	return owned.Kernel{IPVS: h, Dummy: dummy, IPSet: sets}, h.Close, nil
}

// toolKernel is realKernel whose sets are, with --rules-backend=nftables,
// the table's: diff and status read what the proxy writes.
func toolKernel(o *Options) (owned.Kernel, func(), error) {
	k, closeKernel, err := realKernel(o)
	if err != nil || o.RulesBackend != RulesBackendNFTables {
		return k, closeKernel, err
	}
	table, err := nftrules.New(nftrules.DefaultConfig(true, true))
	if err != nil {
		closeKernel()
		return owned.Kernel{}, nil, err
	}
	k.IPSet = table.IPSets()
	return k, func() { _ = table.Close(); closeKernel() }, nil
}

func runCleanup(o *Options, out io.Writer) error {
	k, closeKernel, err := realKernel(o)
	if err != nil {
		return err
	}
	defer closeKernel()
	rules, err := ruleCleaners(o)
	if err != nil && o.RulesBackend == RulesBackendNFTables {
		// A node run with nftables may have no iptables tools at all.
		klog.InfoS("Not looking for iptables chains to remove", "err", err)
		rules, err = nil, nil
	}
	if err != nil {
		return err
	}
	nodePorts, err := toolNodePorts(o, k.Dummy)
	if err != nil {
		// Without them node-port ownership cannot be decided: remove nothing.
		return err
	}
	table, err := nftrules.New(nftrules.DefaultConfig(true, true))
	if err != nil {
		return err
	}
	defer table.Close()
	// Both families' sets: the node may have run with IPv6 before. Both
	// backends' objects: it may have run with the other one.
	c := cleanup.Config{Kernel: k, Sets: owned.Sets(true, true), Rules: rules, Table: table, Exclude: o.parsed.exclude, NodePorts: nodePorts}
	if o.RulesBackend == RulesBackendNFTables {
		// Ownership is read from the table's sets; the ipsets are the
		// iptables backend's leftovers.
		c.Kernel.IPSet, c.IPSets = table.IPSets(), k.IPSet
	}
	res, err := cleanup.Run(c)
	fmt.Fprintf(out, "removed %d virtual servers, %d addresses, %d ipsets, link %s: %t; iptables chains and jump rules cleaned; nftables table inet %s gone: %t\n",
		res.VirtualServers, res.Addresses, res.Sets, dummyif.DefaultLinkName, res.Link, nftrules.TableName, res.Table)
	return err
}

// runDiff computes desired state from the API server exactly as the proxy
// would (same selector, same builder, same node facts) and compares it
// with the kernel.
func runDiff(ctx context.Context, o *Options) (inspect.Diff, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	nodeName, err := hostname(o.HostnameOverride)
	if err != nil {
		return inspect.Diff{}, err
	}
	client, err := newClient(o)
	if err != nil {
		return inspect.Diff{}, err
	}
	k, closeKernel, err := toolKernel(o)
	if err != nil {
		return inspect.Diff{}, err
	}
	defer closeKernel()
	svcs, eps, node, err := listCluster(ctx, client, nodeName)
	if err != nil {
		return inspect.Diff{}, err
	}
	v6, err := toolIPv6(o)
	if err != nil {
		return inspect.Diff{}, err
	}
	cfg, err := diffConfig(o, k.Dummy, node, nodeName, v6)
	if err != nil {
		return inspect.Diff{}, err
	}
	want := inspect.BuildDesired(svcs, eps, &cfg)
	exclude := o.parsed.exclude
	have, err := inspect.Read(k, owned.Sets(true, v6), exclude, cfg.NodePortAddresses, want.Wants)
	if err != nil {
		return inspect.Diff{}, err
	}
	rules, err := ruleLines(o, node, v6)
	if err != nil {
		return inspect.Diff{}, err
	}
	d := inspect.Compare(want, have, dummyif.DefaultLinkName)
	d.Lines = append(d.Lines, rules...)
	return d, nil
}

// diffConfig is the builder config run.go and the node watcher make:
// node name, zone, node-port and host addresses. It runs the proxy's own
// node watcher once, so the node-port address rules cannot drift apart.
func diffConfig(o *Options, dummy dummyif.Interface, node *v1.Node, nodeName string, v6 bool) (sync.Config, error) {
	npFilter := o.parsed.nodePorts
	if npFilter.Primary() {
		// "primary" falls back to the node IP when the Node has no
		// InternalIP, as in the proxy (startupNodeIP).
		npFilter.NodeIP = detectNodeIP(o.BindAddress, node, defaultRouteSource).Addr
	}
	w := nodewatch.New(dummy, npFilter, nil)
	if node != nil {
		w.SetNode(node)
	}
	if err := w.Refresh(); err != nil {
		return sync.Config{}, err
	}
	return w.Config(o.buildConfig(nodeName, v6)), nil
}

// toolNodePorts are the addresses the proxy would serve node ports on,
// found as diff finds them but without the API server (cleanup and status
// must work without it): with --nodeport-addresses=primary the node IP is
// --bind-address or the default route's source, not the Node's
// InternalIPs.
func toolNodePorts(o *Options, dummy dummyif.Interface) ([]netip.Addr, error) {
	cfg, err := diffConfig(o, dummy, nil, "", false)
	return cfg.NodePortAddresses, err
}

// listCluster lists what the proxy's informers would hold, and the Node
// (nil when it does not exist: then there is no zone, as in the proxy).
func listCluster(ctx context.Context, client kubernetes.Interface, nodeName string) ([]*v1.Service, []*discovery.EndpointSlice, *v1.Node, error) {
	opts := metav1.ListOptions{LabelSelector: proxyLabelSelector()}
	sl, err := client.CoreV1().Services("").List(ctx, opts)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list services: %w", err)
	}
	el, err := client.DiscoveryV1().EndpointSlices("").List(ctx, opts)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list endpointslices: %w", err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nil, nil
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("get node %s: %w", nodeName, err)
	}
	svcs := make([]*v1.Service, len(sl.Items))
	for i := range sl.Items {
		svcs[i] = &sl.Items[i]
	}
	eps := make([]*discovery.EndpointSlice, len(el.Items))
	for i := range el.Items {
		eps[i] = &el.Items[i]
	}
	return svcs, eps, node, nil
}

func runStatus(ctx context.Context, o *Options, out io.Writer) error {
	k, closeKernel, err := toolKernel(o)
	if err != nil {
		return err
	}
	defer closeKernel()
	exclude := o.parsed.exclude
	v6, err := toolIPv6(o)
	if err != nil {
		return err
	}
	nodePorts, err := toolNodePorts(o, k.Dummy)
	if err != nil {
		return err
	}
	have, err := inspect.Read(k, owned.Sets(true, v6), exclude, nodePorts, nil)
	if err != nil {
		return err
	}
	st := inspect.Summarize(have)
	if o.MetricsBindAddress != "" {
		st.ProxyURL = metricsURL(o.MetricsBindAddress)
		st.Proxy, st.ProxyReadError = fetchMetrics(ctx, st.ProxyURL)
	}
	return st.Write(out, dummyif.DefaultLinkName, time.Now())
}

// metricsURL is where a proxy bound to addr is reached from this node: a
// wildcard bind is reached on loopback.
func metricsURL(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err == nil && ap.Addr().IsUnspecified() {
		lo := netip.MustParseAddr("127.0.0.1")
		if ap.Addr().Is6() {
			lo = netip.IPv6Loopback()
		}
		addr = netip.AddrPortFrom(lo, ap.Port()).String()
	}
	return "http://" + addr + "/metrics"
}

func fetchMetrics(ctx context.Context, url string) (*inspect.ProxyMetrics, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	return inspect.ParseMetrics(resp.Body)
}

// toolIPv6 decides, as the proxy does, whether this node programs IPv6.
func toolIPv6(o *Options) (bool, error) {
	if o.RulesBackend == RulesBackendNFTables {
		return kernelHasIPv6(), nil
	}
	backend, err := iptablesBackend(o)
	if err != nil {
		return false, err
	}
	return ipv6Usable(backend), nil
}

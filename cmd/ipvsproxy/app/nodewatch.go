package app

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	gosync "sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// taintToBeDeleted is put on a node the cluster autoscaler is removing;
// kube-proxy's /healthz then fails so load balancers drain the node.
const taintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// nodeWatcher follows this node — its Node object (zone label, addresses,
// deletion) and the addresses on its interfaces — and tells the runner
// when what the builder knows about the node changes.
type nodeWatcher struct {
	dummy    dummyif.Interface
	nodePort nodePortFilter
	update   func(sync.NodeFacts) // the runner's UpdateNode

	mu       gosync.Mutex
	node     *v1.Node
	host     []netip.Addr // every address on other interfaces, sorted
	last     nodeFacts
	eligible bool
}

// nodeFacts is what the builder needs from the node.
type nodeFacts struct {
	zone      string
	nodePorts []netip.Addr
	host      []netip.Addr
}

func (f nodeFacts) equal(o nodeFacts) bool {
	return f.zone == o.zone && slices.Equal(f.nodePorts, o.nodePorts) && slices.Equal(f.host, o.host)
}

// nodePortFilter is --nodeport-addresses: CIDRs, and/or "primary" (the
// node's InternalIPs, or the node IP found at start when the Node has no
// InternalIP), and/or "all" (every address). Empty means every
// non-loopback, non-link-local address of the node. Loopback addresses
// never serve node ports: IPVS cannot send traffic from 127.0.0.1 to
// another host (kube-proxy's IPVS mode never served them either), so
// "localhost" and loopback CIDRs are only warned about.
type nodePortFilter struct {
	cidrs    []netip.Prefix
	primary  bool
	loopback []string   // the values asking for loopback node ports, for the warning
	nodeIP   netip.Addr // found at start (nodeip.go); invalid if none was
}

// warning is what the operator should hear about the filter at start
// ("" if nothing).
func (f nodePortFilter) warning() string {
	if len(f.loopback) == 0 {
		return ""
	}
	return fmt.Sprintf("--nodeport-addresses %s: node ports are not served on loopback addresses with IPVS; ignored",
		strings.Join(f.loopback, ","))
}

func (f nodePortFilter) pick(host []netip.Addr, node *v1.Node) []netip.Addr {
	var primaries []netip.Addr
	if f.primary && node != nil {
		for _, a := range node.Status.Addresses {
			if a.Type == v1.NodeInternalIP {
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					primaries = append(primaries, ip.Unmap())
				}
			}
		}
	}
	if f.primary && len(primaries) == 0 && f.nodeIP.IsValid() {
		primaries = []netip.Addr{f.nodeIP}
	}
	var out []netip.Addr
	for _, a := range host {
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() {
			continue
		}
		keep := len(f.cidrs) == 0 && !f.primary
		for _, p := range f.cidrs {
			keep = keep || p.Contains(a)
		}
		keep = keep || slices.Contains(primaries, a)
		if keep {
			out = append(out, a)
		}
	}
	return out
}

// refresh re-reads the interface addresses and reports a change to the
// runner. A failed read keeps what was known.
func (w *nodeWatcher) refresh() {
	addrs, err := w.dummy.LocalAddresses()
	if err != nil {
		klog.ErrorS(err, "Reading the node's addresses")
		return
	}
	// Link-local addresses come and go with every pod's veth (each gets its
	// own fe80::) and can be neither a node port address nor an external
	// or load-balancer IP: leaving them out keeps pod churn from looking
	// like a node change, which would cost a full pass each time.
	addrs = slices.DeleteFunc(addrs, func(a netip.Addr) bool { return a.IsLinkLocalUnicast() })
	slices.SortFunc(addrs, netip.Addr.Compare)
	w.mu.Lock()
	w.host = slices.Compact(addrs)
	w.mu.Unlock()
	w.publish()
}

func (w *nodeWatcher) publish() {
	w.mu.Lock()
	f := nodeFacts{host: w.host, nodePorts: w.nodePort.pick(w.host, w.node)}
	if w.node != nil {
		f.zone = w.node.Labels[sync.LabelZone]
	}
	changed := !f.equal(w.last)
	w.last = f
	w.mu.Unlock()
	if !changed {
		return
	}
	klog.InfoS("Node addresses or zone changed", "nodePortAddresses", f.nodePorts, "hostAddresses", f.host, "zone", f.zone)
	w.update(sync.NodeFacts{Zone: f.zone, NodePortAddresses: f.nodePorts, HostAddresses: f.host})
}

// run polls the interface addresses every period until ctx ends. Polling
// a short address list is cheap and catches every change, including those
// a missed netlink notification would lose.
func (w *nodeWatcher) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.refresh()
		}
	}
}

// handler returns informer callbacks for this node's Node object.
func (w *nodeWatcher) handler() cache.ResourceEventHandler {
	set := func(obj any) {
		n, ok := obj.(*v1.Node)
		if !ok {
			return
		}
		w.mu.Lock()
		w.node = n
		w.eligible = n.DeletionTimestamp == nil && !slices.ContainsFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == taintToBeDeleted })
		w.mu.Unlock()
		w.publish()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(any) {
			w.mu.Lock()
			w.eligible = false
			w.mu.Unlock()
		},
	}
}

// NodeIP is the node's primary IP found at start (invalid if none was).
func (w *nodeWatcher) NodeIP() netip.Addr { return w.nodePort.nodeIP }

// Eligible reports whether the node should receive traffic (for /healthz).
// Before the Node object is seen the node is assumed eligible.
func (w *nodeWatcher) Eligible() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.node == nil || w.eligible
}

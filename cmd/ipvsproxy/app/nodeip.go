package app

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// routeSourceFunc returns the source address the kernel would use to
// reach dst.
type routeSourceFunc func(dst netip.Addr) (netip.Addr, error)

// Well-known public addresses to ask the routing table about; only a
// route lookup is done, no packet is sent.
var routeProbes = []netip.Addr{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("2001:4860:4860::8888")}

// nodeIP is the node's primary address and where it came from.
type nodeIP struct {
	Addr   netip.Addr // invalid when nothing was found
	Source string
}

// detectNodeIP picks the node's primary IP as kube-proxy does: a specific
// --bind-address; else the Node object's addresses, InternalIP before
// ExternalIP; else the source address of the host's default route. With
// an unspecified IPv6 bind address ("::") IPv6 is preferred at each step.
func detectNodeIP(bindAddress string, node *v1.Node, route routeSourceFunc) nodeIP {
	bind, err := netip.ParseAddr(bindAddress)
	if err == nil && !bind.IsUnspecified() {
		return nodeIP{bind.Unmap(), "--bind-address"}
	}
	preferV6 := err == nil && bind.Is6() && !bind.Is4In6()
	byFamily := func(addrs []netip.Addr) []netip.Addr {
		var first, second []netip.Addr
		for _, a := range addrs {
			if a.Is6() == preferV6 {
				first = append(first, a)
			} else {
				second = append(second, a)
			}
		}
		return append(first, second...)
	}
	if node != nil {
		for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
			var found []netip.Addr
			for _, a := range node.Status.Addresses {
				if ip, err := netip.ParseAddr(a.Address); a.Type == typ && err == nil {
					found = append(found, ip.Unmap())
				}
			}
			if f := byFamily(found); len(f) > 0 {
				return nodeIP{f[0], "Node " + string(typ)}
			}
		}
	}
	if route != nil {
		for _, dst := range byFamily(routeProbes) {
			if src, err := route(dst); err == nil && src.IsValid() && !src.IsUnspecified() {
				return nodeIP{src.Unmap(), "default route"}
			}
		}
	}
	return nodeIP{}
}

// defaultRouteSource asks the kernel (RTM_GETROUTE) which source address
// it would use towards dst.
func defaultRouteSource(dst netip.Addr) (netip.Addr, error) {
	routes, err := netlink.RouteGet(net.IP(dst.AsSlice()))
	if err != nil {
		return netip.Addr{}, err
	}
	for _, r := range routes {
		if src, ok := netip.AddrFromSlice(r.Src); ok {
			return src.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no source address towards %s", dst)
}

// startupNodeIP finds and logs the node IP once at start. The Node is
// read once, briefly: a missing or slow apiserver must not hold up the
// start, and the default route is a good answer on most nodes.
func startupNodeIP(ctx context.Context, client kubernetes.Interface, name, bindAddress string) nodeIP {
	var node *v1.Node
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := client.CoreV1().Nodes().Get(gctx, name, metav1.GetOptions{})
	if err == nil {
		node = n
	} else {
		klog.V(1).InfoS("Could not read the Node object for the node IP", "node", name, "err", err)
	}
	ip := detectNodeIP(bindAddress, node, defaultRouteSource)
	if ip.Addr.IsValid() {
		klog.InfoS("Node IP", "ip", ip.Addr, "source", ip.Source)
	} else {
		klog.InfoS("Warning: could not determine the node IP (no --bind-address, no Node address, no default route)")
	}
	return ip
}

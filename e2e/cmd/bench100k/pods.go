//go:build e2e

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The sampled services' endpoints are pods on this node, addressed as
// e2e/framework/pods.go addresses them: a network namespace joined to the
// root namespace by a veth pair, IP/32 on the pod's eth0, default route
// via the link-local 169.254.1.1 that every root-side veth carries, and
// IP/32 routed to the veth in the root namespace (no connected subnet, so
// no broadcast address the kernel would refuse as a real server).
//
// Unlike framework.StartPod, the namespaces and links are made over
// netlink in this process, and each pod's HTTP server is a listener this
// process opened inside the pod's namespace (a socket stays in the
// namespace it was created in): 500 pods cost no process each, where 500
// backend processes would take gigabytes of the guest's memory.
const podGateway = "169.254.1.1"

type pod struct {
	name   string
	ip     net.IP
	ns     netns.NsHandle
	hostIf string
	ln     net.Listener
}

// startPods creates a pod for every endpoint of every sampled service.
func startPods(w *workload) ([]*pod, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	root, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var pods []*pod
	for k, i := range w.sample {
		for j := 0; j < endpointsPer; j++ {
			p := &pod{name: fmt.Sprintf("%s-%d", serviceName(i), j),
				ip: net.IP(vAddr(w.endpointAddr(i, j)).AsSlice()), hostIf: fmt.Sprintf("vb%d", k*endpointsPer+j)}
			if err := p.start(root); err != nil {
				return pods, fmt.Errorf("pod %s: %w", p.name, err)
			}
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// start runs on a locked thread that is in root: it enters a new
// namespace, opens the listener there, and comes back.
func (p *pod) start(root netns.NsHandle) error {
	var err error
	if p.ns, err = netns.New(); err != nil {
		return err
	}
	p.ln, err = net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(targetPort)))
	if serr := netns.Set(root); serr != nil {
		return fmt.Errorf("back to the root namespace: %w", serr) // this thread is lost; so is the run
	}
	if err != nil {
		return err
	}
	if err := p.plumb(); err != nil {
		return err
	}
	go func() {
		mux := http.NewServeMux()
		mux.HandleFunc("/", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, p.name) })
		_ = http.Serve(p.ln, mux)
	}()
	return nil
}

func (p *pod) plumb() error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.hostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(p.ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	// Route sockets only: with no families named, the handle also opens
	// NETLINK_XFRM, which the sandbox's own kernels (built without
	// CONFIG_XFRM_USER) refuse with EPROTONOSUPPORT.
	in, err := netlink.NewHandleAt(p.ns, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer in.Close()
	gw := net.ParseIP(podGateway)
	host32 := func(ip net.IP) *net.IPNet { return &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)} }
	lo, err := in.LinkByName("lo")
	if err != nil {
		return err
	}
	eth0, err := in.LinkByName("eth0")
	if err != nil {
		return err
	}
	host, err := netlink.LinkByName(p.hostIf)
	if err != nil {
		return err
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"lo up", func() error { return in.LinkSetUp(lo) }},
		{"eth0 up", func() error { return in.LinkSetUp(eth0) }},
		{"pod address", func() error { return in.AddrAdd(eth0, &netlink.Addr{IPNet: host32(p.ip)}) }},
		{"gateway route", func() error {
			return in.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: host32(gw), Scope: netlink.SCOPE_LINK})
		}},
		{"default route", func() error { return in.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw}) }},
		{"gateway address", func() error { return netlink.AddrAdd(host, &netlink.Addr{IPNet: host32(gw)}) }},
		{"host veth up", func() error { return netlink.LinkSetUp(host) }},
		{"route to pod", func() error {
			return netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: host32(p.ip), Scope: netlink.SCOPE_LINK})
		}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
	}
	return nil
}

// checkPodsDirect asks every pod once at its own address: the pods work
// before any proxy is involved, so a failing VIP later is the proxy's.
func checkPodsDirect(pods []*pod) error {
	for _, p := range pods {
		got, err := httpGet(context.Background(), p.ip.String(), targetPort)
		if err != nil || got != p.name {
			return fmt.Errorf("pod %s at %s: %q %v", p.name, p.ip, got, err)
		}
	}
	return nil
}

// vipResult is the traffic through one sampled service's ClusterIP.
type vipResult struct {
	Service  string         `json:"service"`
	VIP      string         `json:"vip"`
	Answered int            `json:"answered"`
	Asked    int            `json:"asked"`
	ByPod    map[string]int `json:"byPod"`
	Errors   []string       `json:"errors,omitempty"`
}

// ok: every request answered, every one of the service's pods answered
// some (rr over 10 real servers: 20 new connections reach each twice),
// and no other pod did.
func (v vipResult) ok() bool {
	if v.Answered != v.Asked || len(v.ByPod) != endpointsPer {
		return false
	}
	for name := range v.ByPod {
		if !strings.HasPrefix(name, v.Service+"-") {
			return false
		}
	}
	return true
}

// askVIPs sends n requests, each a new TCP connection, to the ClusterIP of
// every sampled service.
func askVIPs(w *workload, n int) []vipResult {
	var out []vipResult
	for _, i := range w.sample {
		v := vipResult{Service: serviceName(i), VIP: vAddr(clusterIP(i)).String(), Asked: n, ByPod: map[string]int{}}
		for k := 0; k < n; k++ {
			got, err := httpGet(context.Background(), v.VIP, servicePort)
			if err != nil {
				v.Errors = append(v.Errors, err.Error())
				continue
			}
			v.Answered++
			v.ByPod[got]++
		}
		out = append(out, v)
	}
	return out
}

// httpGet is one GET on a new connection, with a short timeout: a VIP
// that does not answer fails, it does not hang the run.
func httpGet(ctx context.Context, ip string, port int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(ip, strconv.Itoa(port))+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status)
	}
	return strings.TrimSpace(string(body)), err
}

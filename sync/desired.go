package sync

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Per-service annotations that choose the IPVS scheduler.
const (
	AnnotationScheduler      = "ipvsproxy.io/scheduler"
	AnnotationSchedulerFlags = "ipvsproxy.io/scheduler-flags"
)

// DefaultAffinityTimeout is kube-proxy's ClientIP affinity timeout (3 hours).
const DefaultAffinityTimeout = 10800

// Config is what the desired-state builder needs to know about the node.
type Config struct {
	NodeName  string // endpoints with this nodeName are local
	Scheduler string // default IPVS scheduler, e.g. "rr"
	IPv4      bool   // program IPv4 objects
	IPv6      bool   // program IPv6 objects
}

// BuildService computes every kernel object svc needs, given the
// EndpointSlices that belong to it. It is a pure function: no I/O, no
// clock, no shared state, so it can be fuzzed. Whatever is wrong with the
// input is skipped and described in the returned problems (one line each),
// never panicked on. A nil svc, ExternalName and headless services yield an
// empty state.
func BuildService(svc *v1.Service, slices []*discovery.EndpointSlice, cfg *Config) (ServiceState, []string) {
	var st ServiceState
	var problems []string
	if svc == nil || svc.Spec.Type == v1.ServiceTypeExternalName {
		return st, nil
	}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	if len(clusterIPs) == 0 || clusterIPs[0] == v1.ClusterIPNone {
		return st, nil // headless: DNS only, nothing for the proxy
	}
	sched, flags, schedProblems := schedulerFor(svc, cfg.Scheduler)
	problems = append(problems, schedProblems...)
	affinity := affinityTimeout(svc)

	for _, ipStr := range clusterIPs {
		ip, err := netip.ParseAddr(ipStr)
		if err != nil || ip.Zone() != "" {
			problems = append(problems, fmt.Sprintf("clusterIP %q is not an IP address", ipStr))
			continue
		}
		ip = ip.Unmap()
		if (ip.Is4() && !cfg.IPv4) || (ip.Is6() && !cfg.IPv6) {
			continue
		}
		programmed := false
		for i := range svc.Spec.Ports {
			sp := &svc.Spec.Ports[i]
			proto, ok := protocolOf(sp.Protocol)
			if !ok {
				problems = append(problems, fmt.Sprintf("port %q: protocol %q is not supported", sp.Name, sp.Protocol))
				continue
			}
			if sp.Port < 1 || sp.Port > 65535 {
				problems = append(problems, fmt.Sprintf("port %q: port %d is out of range 1-65535", sp.Name, sp.Port))
				continue
			}
			eps := selectEndpoints(slices, sp, ip.Is6(), cfg.NodeName)
			vs := ipvs.VirtualServer{
				ServiceKey: ipvs.ServiceKey{Address: ip, Protocol: proto, Port: uint16(sp.Port)},
				Scheduler:  sched,
				Flags:      flags,
			}
			if affinity > 0 {
				vs.Flags |= ipvs.FlagPersistent
				vs.Timeout = affinity
			}
			vss := VirtualServerState{VS: vs, Reals: make([]ipvs.RealServer, 0, len(eps))}
			for _, ep := range eps {
				vss.Reals = append(vss.Reals, ipvs.RealServer{RealKey: ep.key, Weight: 1})
				if ep.local {
					st.Entries = append(st.Entries, SetEntry{Set: SetName(SetLoopBack, ip.Is6()), Entry: ipset.Entry{
						IP: ep.key.Address, Protocol: proto.String(), Port: ep.key.Port, IP2: ep.key.Address,
					}})
				}
			}
			st.VirtualServers = append(st.VirtualServers, vss)
			st.Entries = append(st.Entries, SetEntry{Set: SetName(SetClusterIP, ip.Is6()), Entry: ipset.Entry{
				IP: ip, Protocol: proto.String(), Port: uint16(sp.Port),
			}})
			programmed = true
		}
		if programmed {
			st.Addresses = append(st.Addresses, ip)
		}
	}
	st.normalize()
	return st, problems
}

func protocolOf(p v1.Protocol) (ipvs.Protocol, bool) {
	switch p {
	case v1.ProtocolTCP, "":
		return ipvs.TCP, true
	case v1.ProtocolUDP:
		return ipvs.UDP, true
	case v1.ProtocolSCTP:
		return ipvs.SCTP, true
	}
	return 0, false
}

func affinityTimeout(svc *v1.Service) uint32 {
	if svc.Spec.SessionAffinity != v1.ServiceAffinityClientIP {
		return 0
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		if t := *c.ClientIP.TimeoutSeconds; t > 0 && t <= 86400 {
			return uint32(t)
		}
	}
	return DefaultAffinityTimeout
}

// Schedulers are the IPVS schedulers a service may ask for.
var Schedulers = map[string]bool{
	"rr": true, "wrr": true, "lc": true, "wlc": true, "lblc": true, "lblcr": true,
	"dh": true, "sh": true, "sed": true, "nq": true, "mh": true,
}

var schedulerFlagBits = map[string]ipvs.Flags{
	"sh-fallback": ipvs.FlagSchedFlag1, "sh-port": ipvs.FlagSchedFlag2,
	"mh-fallback": ipvs.FlagSchedFlag1, "mh-port": ipvs.FlagSchedFlag2,
}

// schedulerFor reads the per-service scheduler annotations. An invalid
// value is reported and the default is used: a typo must not take a
// service down.
func schedulerFor(svc *v1.Service, def string) (string, ipvs.Flags, []string) {
	var problems []string
	sched := def
	if v, ok := svc.Annotations[AnnotationScheduler]; ok {
		if Schedulers[v] {
			sched = v
		} else {
			problems = append(problems, fmt.Sprintf("annotation %s: unknown scheduler %q; using %q", AnnotationScheduler, truncate(v), def))
		}
	}
	var flags ipvs.Flags
	if v, ok := svc.Annotations[AnnotationSchedulerFlags]; ok && v != "" {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			bit, known := schedulerFlagBits[f]
			if !known || !strings.HasPrefix(f, sched+"-") {
				problems = append(problems, fmt.Sprintf("annotation %s: flag %q does not apply to scheduler %q; ignored", AnnotationSchedulerFlags, truncate(f), sched))
				continue
			}
			flags |= bit
		}
	}
	return sched, flags, problems
}

// truncate keeps hostile annotation values from flooding events and logs.
func truncate(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

type endpoint struct {
	key   ipvs.RealKey
	local bool
}

// selectEndpoints returns the backends of one service port in one family:
// the ready endpoints, or, when none is ready, the serving ones that are
// terminating (so a service whose pods are all shutting down still answers
// while they drain). Duplicates across slices are dropped.
func selectEndpoints(slices []*discovery.EndpointSlice, sp *v1.ServicePort, v6 bool, node string) []endpoint {
	want := discovery.AddressTypeIPv4
	if v6 {
		want = discovery.AddressTypeIPv6
	}
	var ready, terminating []endpoint
	seen := map[ipvs.RealKey]bool{}
	for _, sl := range slices {
		if sl == nil || sl.AddressType != want {
			continue
		}
		port, ok := slicePort(sl, sp)
		if !ok {
			continue
		}
		for i := range sl.Endpoints {
			ep := &sl.Endpoints[i]
			if len(ep.Addresses) == 0 {
				continue
			}
			addr, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || addr.Zone() != "" {
				continue
			}
			addr = addr.Unmap()
			if addr.Is6() != v6 || !addr.IsGlobalUnicast() && !addr.IsPrivate() {
				continue
			}
			k := ipvs.RealKey{Address: addr, Port: port}
			if seen[k] {
				continue
			}
			e := endpoint{key: k, local: ep.NodeName != nil && node != "" && *ep.NodeName == node}
			c := ep.Conditions
			isReady := c.Ready == nil || *c.Ready
			isServing := isReady
			if c.Serving != nil {
				isServing = *c.Serving
			}
			isTerminating := c.Terminating != nil && *c.Terminating
			switch {
			case isReady:
				seen[k] = true
				ready = append(ready, e)
			case isServing && isTerminating:
				seen[k] = true
				terminating = append(terminating, e)
			}
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}

// slicePort finds the slice's port that serves the service port: same name,
// same protocol, a valid number.
func slicePort(sl *discovery.EndpointSlice, sp *v1.ServicePort) (uint16, bool) {
	for _, p := range sl.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		proto := v1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if name != sp.Name || proto != sp.Protocol && !(sp.Protocol == "" && proto == v1.ProtocolTCP) {
			continue
		}
		if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			return 0, false
		}
		return uint16(*p.Port), true
	}
	return 0, false
}

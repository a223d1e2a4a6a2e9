package sync

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Per-service annotations that choose the IPVS scheduler.
const (
	AnnotationScheduler      = "ipvsproxy.io/scheduler"
	AnnotationSchedulerFlags = "ipvsproxy.io/scheduler-flags"
	// kube-router's, read as aliases so that Services keep their scheduler
	// when a node moves from kube-router; ours win when both are set.
	// kube-router names the flags flag-1 and flag-2 (the kernel's
	// IP_VS_SVC_F_SCHED1/2): for sh and mh, -fallback and -port.
	AnnotationKubeRouterScheduler  = "kube-router.io/service.scheduler"
	AnnotationKubeRouterSchedFlags = "kube-router.io/service.schedflags"
)

// DefaultAffinityTimeout is kube-proxy's ClientIP affinity timeout (3 hours).
const DefaultAffinityTimeout = 10800

// Config is what the desired-state builder needs to know about the node.
type Config struct {
	NodeName  string // endpoints with this nodeName are local
	Zone      string // this node's topology.kubernetes.io/zone label
	Scheduler string // default IPVS scheduler, e.g. "rr"
	IPv4      bool   // program IPv4 objects
	IPv6      bool   // program IPv6 objects
	// NodePortAddresses are the node addresses NodePort virtual servers
	// are made on (after --nodeport-addresses filtering).
	NodePortAddresses []netip.Addr
	// HostAddresses are the addresses on the node's other interfaces,
	// sorted: an external or load-balancer IP already there is not bound
	// again on kube-ipvs0.
	HostAddresses []netip.Addr
	// MissingSchedulers are schedulers the kernel refused because their
	// module is not loaded; a service asking for one gets the default,
	// and a Warning, as for an unknown name. Note keeps it.
	MissingSchedulers map[string]bool
	// ExcludeCIDRs is --ipvs-exclude-cidrs: virtual servers and addresses
	// there belong to someone else (keepalived, a hand-made LVS). A
	// service address inside is never programmed, so never adopted,
	// rewritten or deleted either, and the service gets a Warning.
	ExcludeCIDRs []netip.Prefix
}

// SchedulerEvent tells the builder about a scheduler's kernel module: the
// kernel refused the scheduler Name because its module is not loaded, or
// (Loaded) it has been loaded since.
type SchedulerEvent struct {
	Name   string
	Loaded bool
}

// Note applies a scheduler event to what the builder knows. The default
// scheduler is never marked missing: it was checked at start, and there
// would be nothing to fall back to.
func (c *Config) Note(ev SchedulerEvent) {
	switch {
	case ev.Loaded && c.MissingSchedulers[ev.Name]:
		delete(c.MissingSchedulers, ev.Name)
		klog.InfoS("IPVS scheduler loaded; services asking for it get it", "scheduler", ev.Name)
	case !ev.Loaded && ev.Name != c.Scheduler && !c.MissingSchedulers[ev.Name]:
		if c.MissingSchedulers == nil {
			c.MissingSchedulers = map[string]bool{}
		}
		c.MissingSchedulers[ev.Name] = true
		klog.InfoS("IPVS scheduler not available in this kernel; services asking for it use the default",
			"scheduler", ev.Name, "default", c.Scheduler)
	}
}

// Built is everything Build derives from one service.
type Built struct {
	State    ServiceState
	Problems []string // one line each; reported as a Warning Event
	// NoLocalInternal/External: a Local traffic policy left this node with
	// no backend while the service has some elsewhere.
	NoLocalInternal, NoLocalExternal bool
	// HealthCheckNodePort is set for a LoadBalancer service with
	// externalTrafficPolicy=Local; LocalEndpoints is what it reports.
	HealthCheckNodePort uint16
	LocalEndpoints      int
}

// Build computes every kernel object svc needs, given the EndpointSlices
// that belong to it. It is a pure function: no I/O, no clock, no shared
// state, so it can be fuzzed. Whatever is wrong with the input is skipped
// and described in Problems (one line each), never panicked on. A nil svc,
// ExternalName and headless services yield an empty state.
func Build(svc *v1.Service, slices []*ProxySlice, cfg *Config) Built {
	var b Built
	if svc == nil || svc.Spec.Type == v1.ServiceTypeExternalName {
		return b
	}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	if len(clusterIPs) == 0 || clusterIPs[0] == v1.ClusterIPNone {
		return b // headless: DNS only, nothing for the proxy
	}
	sb := serviceBuilder{svc: svc, cfg: cfg, out: &b}
	sb.sched, sb.flags, b.Problems = schedulerFor(svc, cfg.Scheduler, cfg.MissingSchedulers)
	sb.affinity = affinityTimeout(svc)
	sb.weights = sb.weightsFor()
	sb.parseExternal()
	for _, ipStr := range clusterIPs {
		ip, err := netip.ParseAddr(ipStr)
		if err != nil || ip.Zone() != "" {
			sb.problem("clusterIP %q is not an IP address", ipStr)
			continue
		}
		ip = ip.Unmap()
		if (ip.Is4() && !cfg.IPv4) || (ip.Is6() && !cfg.IPv6) || sb.excluded("clusterIP", ip) {
			continue
		}
		for i := range svc.Spec.Ports {
			sb.port(ip, &svc.Spec.Ports[i], slices)
		}
	}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		if p := svc.Spec.HealthCheckNodePort; p > 0 && p <= 65535 {
			b.HealthCheckNodePort = uint16(p)
			b.LocalEndpoints = len(sb.localEps)
			for _, v6 := range []bool{false, true} {
				if sb.programmed[family(v6)] {
					sb.entry(owned.SetHealthCheckNodePort, v6, ipset.Entry{Port: uint16(p)})
				}
			}
		}
	}
	b.State.normalize()
	return b
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

// Schedulers are the IPVS schedulers a service or --ipvs-scheduler may
// name: every one the kernel ships (ipvs.Schedulers). Refusing one the
// kernel has would only make users patch around us.
var Schedulers = func() map[string]bool {
	m := make(map[string]bool, len(ipvs.Schedulers))
	for _, n := range ipvs.Schedulers {
		m[n] = true
	}
	return m
}()

var schedulerFlagBits = map[string]ipvs.Flags{
	"sh-fallback": ipvs.FlagSchedFlag1, "sh-port": ipvs.FlagSchedFlag2,
	"mh-fallback": ipvs.FlagSchedFlag1, "mh-port": ipvs.FlagSchedFlag2,
}

// schedulerFor reads the per-service scheduler annotations. An invalid
// value, or a scheduler this kernel cannot load, is reported and the
// default is used: a typo or a missing module must not take a service down.
func schedulerFor(svc *v1.Service, def string, missing map[string]bool) (string, ipvs.Flags, []string) {
	var problems []string
	sched := def
	if key, v, ok := annotation(svc, AnnotationScheduler, AnnotationKubeRouterScheduler); ok {
		switch {
		case !Schedulers[v]:
			problems = append(problems, fmt.Sprintf("annotation %s: unknown scheduler %q; using %q", key, truncate(v), def))
		case missing[v]:
			problems = append(problems, fmt.Sprintf("annotation %s: scheduler %q is not available in this kernel (load the ip_vs_%s module); using %q", key, v, v, def))
		default:
			sched = v
		}
	}
	var flags ipvs.Flags
	if key, v, ok := annotation(svc, AnnotationSchedulerFlags, AnnotationKubeRouterSchedFlags); ok && v != "" {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			name := f
			if key == AnnotationKubeRouterSchedFlags {
				name = kubeRouterFlag(f, sched)
			}
			bit, known := schedulerFlagBits[name]
			if !known || !strings.HasPrefix(name, sched+"-") {
				problems = append(problems, fmt.Sprintf("annotation %s: flag %q does not apply to scheduler %q; ignored", key, truncate(f), sched))
				continue
			}
			flags |= bit
		}
	}
	return sched, flags, problems
}

// annotation returns ours, else kube-router's alias, and which was used.
func annotation(svc *v1.Service, ours, kubeRouter string) (key, value string, ok bool) {
	if v, ok := svc.Annotations[ours]; ok {
		return ours, v, true
	}
	v, ok := svc.Annotations[kubeRouter]
	return kubeRouter, v, ok
}

// kubeRouterFlag names kube-router's flag-1/flag-2 as ours for sched.
func kubeRouterFlag(f, sched string) string {
	switch f {
	case "flag-1":
		return sched + "-fallback"
	case "flag-2":
		return sched + "-port"
	}
	return f
}

// truncate keeps hostile annotation values from flooding events and logs.
func truncate(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

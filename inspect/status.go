package inspect

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Kinds of virtual server, as the status screen counts them.
const (
	KindClusterIP    = "ClusterIP"
	KindNodePort     = "NodePort"
	KindLoadBalancer = "LoadBalancer"
	KindExternal     = "external"
	KindUnlisted     = "unlisted" // owned (address on kube-ipvs0) but in no set: stale, pruned by the next full pass
)

var kindOrder = []string{KindClusterIP, KindNodePort, KindLoadBalancer, KindExternal, KindUnlisted}

// Status is what is programmed, read from the kernel alone.
type Status struct {
	Link           bool
	Addresses      int
	Kinds          map[string]int // owned virtual servers by kind
	Foreign        int            // virtual servers ipvsproxy does not own
	Reals          int            // real servers of owned virtual servers
	Draining       int            // of those, at weight 0
	SetEntries     []SetCount     // existing owned sets, in creation order
	MissingSets    []string
	Proxy          *ProxyMetrics // nil: no running proxy's metrics were read
	ProxyURL       string
	ProxyReadError error
}

// SetCount is the number of entries of one set.
type SetCount struct {
	Name    string
	Entries int
}

// Summarize counts what a kernel read holds. The kind of a virtual server
// comes from the sets that describe it, as the iptables rules see it.
func Summarize(a *Actual) Status {
	st := Status{Link: a.Link, Addresses: len(a.Addresses), Kinds: map[string]int{}}
	entries := map[owned.SetEntry]bool{}
	perSet := map[string]int{}
	for _, e := range a.Entries {
		entries[e] = true
		perSet[e.Set]++
	}
	for _, s := range a.Sets {
		st.SetEntries = append(st.SetEntries, SetCount{s.Name, perSet[s.Name]})
	}
	for _, s := range a.Missing {
		st.MissingSets = append(st.MissingSets, s.Name)
	}
	for _, kv := range a.VirtualServers {
		if !kv.Owned {
			st.Foreign++
			continue
		}
		st.Kinds[kindOf(kv.VS.ServiceKey, entries)]++
		st.Reals += len(kv.Reals)
		for _, rs := range kv.Reals {
			if rs.Weight == 0 {
				st.Draining++
			}
		}
	}
	return st
}

func kindOf(k ipvs.ServiceKey, entries map[owned.SetEntry]bool) string {
	v6 := k.Address.Is6()
	e := ipset.Entry{IP: k.Address, Protocol: k.Protocol.String(), Port: k.Port}
	in := func(base string, e ipset.Entry) bool {
		return entries[owned.SetEntry{Set: owned.SetName(base, v6), Entry: e}]
	}
	switch {
	case in(owned.SetClusterIP, e):
		return KindClusterIP
	case in(owned.SetLoadBalancer, e):
		return KindLoadBalancer
	case in(owned.SetExternalIP, e):
		return KindExternal
	case in(owned.SetNodePortSCTP, e),
		k.Protocol == ipvs.TCP && in(owned.SetNodePortTCP, ipset.Entry{Port: k.Port}),
		k.Protocol == ipvs.UDP && in(owned.SetNodePortUDP, ipset.Entry{Port: k.Port}):
		return KindNodePort
	}
	return KindUnlisted
}

// ProxyMetrics are the running proxy's own figures, from its /metrics.
type ProxyMetrics struct {
	LastSync           time.Time          // kubeproxy_sync_proxy_rules_last_timestamp_seconds; zero: never
	Syncs              map[string]float64 // ipvsproxy_syncs_total by kind
	FailedServices     float64            // ipvsproxy_sync_failed_services_total
	RestoreFailures    float64            // kubeproxy_sync_proxy_rules_iptables_restore_failures_total
	KernelOps          map[string]float64 // ipvsproxy_kernel_ops_total by result (ok, error)
	ServicesProgrammed float64            // ipvsproxy_services_programmed
}

// ParseMetrics reads the figures the status screen shows from a
// Prometheus text exposition.
func ParseMetrics(r io.Reader) (*ProxyMetrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	m := &ProxyMetrics{Syncs: map[string]float64{}, KernelOps: map[string]float64{}}
	value := func(name string, byLabel string, into map[string]float64) float64 {
		f := fams[name]
		if f == nil {
			return 0
		}
		var sum float64
		for _, s := range f.GetMetric() {
			v := s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue()
			sum += v
			for _, l := range s.GetLabel() {
				if into != nil && l.GetName() == byLabel {
					into[l.GetValue()] += v
				}
			}
		}
		return sum
	}
	// One series per ip_family (the same batch's time on a dual-stack
	// node): the latest, not the sum.
	var ts float64
	for _, s := range fams["kubeproxy_sync_proxy_rules_last_timestamp_seconds"].GetMetric() {
		ts = max(ts, s.GetGauge().GetValue())
	}
	if ts > 0 {
		m.LastSync = time.Unix(0, int64(ts*1e9))
	}
	value("ipvsproxy_syncs_total", "kind", m.Syncs)
	value("ipvsproxy_kernel_ops_total", "result", m.KernelOps)
	m.FailedServices = value("ipvsproxy_sync_failed_services_total", "", nil)
	m.RestoreFailures = value("kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "", nil)
	m.ServicesProgrammed = value("ipvsproxy_services_programmed", "", nil)
	return m, nil
}

// Write prints the status screen. now is the time "ago" is counted from.
func (st Status) Write(w io.Writer, linkName string, now time.Time) error {
	var b strings.Builder
	owned := 0
	var kinds []string
	for _, k := range kindOrder {
		owned += st.Kinds[k]
		if n := st.Kinds[k]; n > 0 || k != KindUnlisted {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
	}
	fmt.Fprintf(&b, "virtual servers  %d owned (%s); %d foreign\n", owned, strings.Join(kinds, ", "), st.Foreign)
	fmt.Fprintf(&b, "real servers     %d (%d draining at weight 0)\n", st.Reals, st.Draining)
	if st.Link {
		fmt.Fprintf(&b, "%-16s %d addresses\n", linkName, st.Addresses)
	} else {
		fmt.Fprintf(&b, "%-16s missing\n", linkName)
	}
	var nonEmpty []string
	empty := 0
	for _, s := range st.SetEntries {
		if s.Entries == 0 {
			empty++
			continue
		}
		nonEmpty = append(nonEmpty, fmt.Sprintf("%s %d", s.Name, s.Entries))
	}
	fmt.Fprintf(&b, "ipsets           %d present (%d empty), %d missing\n", len(st.SetEntries), empty, len(st.MissingSets))
	for _, s := range nonEmpty {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	// Names help when some sets are gone; when none exist (the proxy never
	// ran here, or cleanup ran) the count says it all.
	if len(st.MissingSets) > 0 && len(st.SetEntries) > 0 {
		fmt.Fprintf(&b, "  missing: %s\n", strings.Join(st.MissingSets, " "))
	}
	st.writeProxy(&b, now)
	_, err := io.WriteString(w, b.String())
	return err
}

func (st Status) writeProxy(b *strings.Builder, now time.Time) {
	if st.Proxy == nil {
		if st.ProxyURL != "" {
			fmt.Fprintf(b, "proxy            not reachable at %s: %v\n", st.ProxyURL, st.ProxyReadError)
		}
		return
	}
	m := st.Proxy
	fmt.Fprintf(b, "proxy            %s\n", st.ProxyURL)
	if m.LastSync.IsZero() {
		fmt.Fprintf(b, "  last sync      never\n")
	} else {
		fmt.Fprintf(b, "  last sync      %s (%s ago)\n", m.LastSync.UTC().Format(time.RFC3339), now.Sub(m.LastSync).Round(time.Second))
	}
	fmt.Fprintf(b, "  syncs          %s\n", countsLine(m.Syncs))
	fmt.Fprintf(b, "  failures       %g service syncs, %g iptables-restore\n", m.FailedServices, m.RestoreFailures)
	fmt.Fprintf(b, "  kernel ops     %s\n", countsLine(m.KernelOps))
	fmt.Fprintf(b, "  services       %g programmed\n", m.ServicesProgrammed)
}

func countsLine(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %g", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

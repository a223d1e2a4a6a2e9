package sync

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sync's Prometheus metrics. The kubeproxy_* ones are
// kube-proxy's, with its names, types, labels and buckets (checked against
// kube-proxy's own registry by cmd/ipvsproxy/app's metrics test), so
// dashboards and alerts built for its IPVS mode keep working; ipvsproxy_*
// are ipvsproxy's own.
//
// kube-proxy labels most of its metrics with ip_family ("IPv4", "IPv6"):
// on a dual-stack node it runs one proxier per family. ipvsproxy syncs
// both families in one batch, so a batch's duration and timestamps are
// recorded under every family the node serves, and the per-service counts
// under each family the Service has.
type Metrics struct {
	SyncDuration       *prometheus.HistogramVec
	FullPassDuration   *prometheus.HistogramVec
	NetworkProgramming *prometheus.HistogramVec
	LastSync           *prometheus.GaugeVec
	LastQueued         *prometheus.GaugeVec
	EndpointChanges    prometheus.Counter
	EndpointPending    prometheus.Gauge
	ServiceChanges     prometheus.Counter
	ServicePending     prometheus.Gauge
	Syncs              *prometheus.CounterVec
	SyncFailures       prometheus.Counter
	ServicesFailing    prometheus.Gauge
	KernelOps          *prometheus.CounterVec
	ServicesProgrammed prometheus.Gauge
	NoLocalEndpoints   *prometheus.GaugeVec
	RestoreFailures    *prometheus.CounterVec
	// NFTablesSyncFailures counts Syncs of the nftables table that failed
	// (read back or written); NFTablesCleanupFailures, deletions of the
	// table that failed (a switch back to iptables). kube-proxy's
	// nftables-mode names; its labels are the families the table serves.
	NFTablesSyncFailures    *prometheus.CounterVec
	NFTablesCleanupFailures *prometheus.CounterVec
	Draining                prometheus.Gauge
	ConntrackDeleted        prometheus.Counter
	ConntrackDuration       *prometheus.HistogramVec // kube-proxy's conntrack reconciler: one stale-flow walk
	ConntrackReconcile      *prometheus.CounterVec   // entries that walk deleted, by family
	SetGrowths              prometheus.Counter
	CriticalProgrammed      prometheus.Gauge
	// PassRuleRepairs counts the full passes whose node set-up found the
	// fixed rules (or the nftables table) changed by another program and
	// rewrote them; the monitors count the repairs they make between
	// passes in their own counters (cmd/ipvsproxy/app/startup.go).
	PassRuleRepairs prometheus.Counter

	families []string // the node's, set by the runner
}

// The ip_family label values, kube-proxy's (v1.IPv4Protocol, v1.IPv6Protocol).
const (
	FamilyIPv4 = "IPv4"
	FamilyIPv6 = "IPv6"
)

// NetworkProgrammingBuckets are kube-proxy's: 0.25 s and 0.5 s, then every
// second to 59 s, every 5 s to 115 s, every 30 s to 5 min; and a bucket at
// 0 first, which component-base's MergeBuckets (which kube-proxy builds
// them with) puts there. Kept, so that the le labels are the same.
func NetworkProgrammingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{families: []string{FamilyIPv4}}
	m.newKubeProxyMetrics()
	m.newOwnMetrics()
	if reg != nil {
		reg.MustRegister(m.SyncDuration, m.FullPassDuration, m.NetworkProgramming, m.LastSync, m.LastQueued,
			m.EndpointChanges, m.EndpointPending, m.ServiceChanges, m.ServicePending,
			m.NoLocalEndpoints, m.RestoreFailures, m.NFTablesSyncFailures, m.NFTablesCleanupFailures, m.Syncs, m.SyncFailures, m.ServicesFailing, m.KernelOps,
			m.ServicesProgrammed, m.Draining, m.ConntrackDeleted, m.ConntrackDuration, m.ConntrackReconcile, m.SetGrowths, m.CriticalProgrammed, m.PassRuleRepairs)
	}
	return m
}

// newKubeProxyMetrics makes the kubeproxy_* metrics, as kube-proxy
// defines them (pkg/proxy/metrics). It sets the whole struct: call it first.
func (m *Metrics) newKubeProxyMetrics() {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15) // 1 ms … 16 s, kube-proxy's
	family := []string{"ip_family"}
	*m = Metrics{
		families: m.families,
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "duration_seconds",
			Help: "SyncProxyRules latency in seconds", Buckets: buckets}, family),
		// Named like kube-proxy's (iptables and nftables modes), with its
		// label but longer buckets: a full pass here runs in steps between
		// incremental syncs, so this is its wall time from start to prune,
		// minutes on a large node, not time the proxy was blocked.
		FullPassDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Subsystem: "sync_full_proxy_rules", Name: "duration_seconds",
			Help:    "Full pass (kernel read, drift repaired, stale objects pruned) duration in seconds, from start to end",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 18)}, family), // 10 ms … 22 min
		NetworkProgramming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "network_programming_duration_seconds",
			Help:    "In Cluster Network Programming Latency in seconds",
			Buckets: NetworkProgrammingBuckets()}, family),
		LastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced"}, family),
		LastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued"}, family),
		EndpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes"}),
		EndpointPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes"}),
		ServiceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "service_changes_total",
			Help: "Cumulative proxy rules Service changes"}),
		ServicePending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "service_changes_pending",
			Help: "Pending proxy rules Service changes"}),
		// A gauge despite its name, as in kube-proxy.
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy", "ip_family"}),
		RestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "iptables_restore_failures_total",
			Help: "Cumulative proxy iptables restore failures"}, family),
		NFTablesSyncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "nftables_sync_failures_total",
			Help: "Cumulative proxy nftables sync failures"}, family),
		NFTablesCleanupFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "nftables_cleanup_failures_total",
			Help: "Cumulative proxy nftables cleanup failures"}, family),
		ConntrackDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "conntrack_reconciler_sync_duration_seconds",
			Help: "ReconcileConntrackFlowsLatency latency in seconds", Buckets: buckets}, family),
		ConntrackReconcile: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Name: "conntrack_reconciler_deleted_entries_total",
			Help: "Cumulative conntrack flows deleted by conntrack reconciler"}, family),
	}
}

// newOwnMetrics makes the ipvsproxy_* metrics.
func (m *Metrics) newOwnMetrics() {
	ownCounter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ipvsproxy", Name: name, Help: help})
	}
	ownGauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ipvsproxy", Name: name, Help: help})
	}
	m.Syncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "ipvsproxy", Name: "syncs_total",
		Help: "Sync batches run, by kind: incremental (only changed services) or full (kernel read, drift repaired)"}, []string{"kind"})
	m.SyncFailures = ownCounter("sync_failed_services_total",
		"Service syncs that failed and were queued for retry")
	m.ServicesFailing = ownGauge("services_sync_failing",
		"Services whose last sync failed (a kernel write refused, a virtual server another Service holds); each is retried with backoff and has a Warning Event")
	m.KernelOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "ipvsproxy", Name: "kernel_ops_total",
		Help: "Kernel writes by object, verb and result"}, []string{"object", "verb", "result"})
	m.ServicesProgrammed = ownGauge("services_programmed",
		"Services with kernel state applied, as of the last full pass")
	m.Draining = ownGauge("real_servers_draining",
		"Real servers at weight 0 waiting for their connections to end")
	m.SetGrowths = ownCounter("ipset_growths_total",
		"ipsets replaced by larger ones (filled, then swapped in atomically) because they had to hold more entries")
	m.ConntrackDeleted = ownCounter("conntrack_udp_entries_deleted_total",
		"Stale UDP conntrack entries deleted after their backend went away")
	m.PassRuleRepairs = ownCounter("full_pass_rule_repairs_total",
		"Full passes that found the fixed iptables rules or the nftables table changed by another program and rewrote them (repairs between passes: ipvsproxy_iptables_canary_restores_total, ipvsproxy_nftables_table_restores_total)")
	m.CriticalProgrammed = ownGauge("critical_services_programmed_seconds",
		"Seconds from the proxy's start until every critical Service (--critical-services and default/kubernetes) of the informers' initial lists was programmed, endpoints included; 0 until then")
}

// NFTablesFailed counts a failure of the nftables table (Sync or
// cleanup, c) under every family the node serves: the one inet table
// stands in for kube-proxy's table per family.
func (m *Metrics) NFTablesFailed(c *prometheus.CounterVec, v6 bool) {
	c.WithLabelValues(FamilyIPv4).Inc()
	if v6 {
		c.WithLabelValues(FamilyIPv6).Inc()
	}
}

// setFamilies records the families the node serves.
func (m *Metrics) setFamilies(v6 bool) {
	m.families = []string{FamilyIPv4}
	if v6 {
		m.families = append(m.families, FamilyIPv6)
	}
}

func (m *Metrics) observeOp(op Op, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.KernelOps.WithLabelValues(op.Object, op.Verb, result).Inc()
}

// changed counts one recorded change. The pending gauges are approximate
// (changes since the last batch), which is what they mean in kube-proxy.
func (m *Metrics) changed(endpoints bool, at time.Time) {
	if endpoints {
		m.EndpointChanges.Inc()
		m.EndpointPending.Inc()
	} else {
		m.ServiceChanges.Inc()
		m.ServicePending.Inc()
	}
	for _, f := range m.families {
		m.LastQueued.WithLabelValues(f).Set(float64(at.UnixNano()) / 1e9)
	}
}

// synced records a batch. nodeOK: no node-wide step failed, so the batch
// counts as a sync even if some services failed (see processBatch).
func (m *Metrics) synced(full bool, start, end time.Time, queuedAt int64, failed int, nodeOK bool, stillQueued int) {
	kind := "incremental"
	if full {
		kind = "full"
	}
	m.Syncs.WithLabelValues(kind).Inc()
	m.SyncFailures.Add(float64(failed))
	for _, f := range m.families {
		m.SyncDuration.WithLabelValues(f).Observe(end.Sub(start).Seconds())
		if nodeOK {
			m.LastSync.WithLabelValues(f).Set(float64(end.UnixNano()) / 1e9)
			if queuedAt != 0 {
				m.NetworkProgramming.WithLabelValues(f).Observe(end.Sub(time.Unix(0, queuedAt)).Seconds())
			}
		}
	}
	if stillQueued == 0 {
		m.EndpointPending.Set(0)
		m.ServicePending.Set(0)
	}
}

func (m *Metrics) fullPass(d time.Duration) {
	for _, f := range m.families {
		m.FullPassDuration.WithLabelValues(f).Observe(d.Seconds())
	}
}

// conntrackCleared records one stale-flow walk of family f.
func (m *Metrics) conntrackCleared(f string, took time.Duration, deleted int) {
	m.ConntrackDuration.WithLabelValues(f).Observe(took.Seconds())
	m.ConntrackReconcile.WithLabelValues(f).Add(float64(deleted))
	m.ConntrackDeleted.Add(float64(deleted))
}

func (m *Metrics) noLocalEndpoints(byKey map[string]noLocal) {
	type policyFamily struct{ policy, family string }
	n := map[policyFamily]int{}
	for _, f := range m.families {
		n[policyFamily{"internal", f}], n[policyFamily{"external", f}] = 0, 0
	}
	for _, nl := range byKey {
		for _, f := range nl.families() {
			if nl.internal {
				n[policyFamily{"internal", f}]++
			}
			if nl.external {
				n[policyFamily{"external", f}]++
			}
		}
	}
	for k, v := range n {
		m.NoLocalEndpoints.WithLabelValues(k.policy, k.family).Set(float64(v))
	}
}

func (m *Metrics) servicesFailing(n int) { m.ServicesFailing.Set(float64(n)) }

func (m *Metrics) draining(n int) { m.Draining.Set(float64(n)) }

func (m *Metrics) services(n int) { m.ServicesProgrammed.Set(float64(n)) }

func (m *Metrics) criticalProgrammed(d time.Duration) { m.CriticalProgrammed.Set(d.Seconds()) }

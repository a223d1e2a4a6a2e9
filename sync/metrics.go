package sync

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sync's Prometheus metrics. The kubeproxy_* names are
// kube-proxy's, so dashboards and alerts built for its IPVS mode keep
// working; ipvsproxy_* are ipvsproxy's own.
type Metrics struct {
	SyncDuration       prometheus.Histogram
	FullPassDuration   prometheus.Histogram
	NetworkProgramming prometheus.Histogram
	LastSync           prometheus.Gauge
	LastQueued         prometheus.Gauge
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
	RestoreFailures    prometheus.Counter
	Draining           prometheus.Gauge
	ConntrackDeleted   prometheus.Counter
	SetGrowths         prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15) // 1 ms … 16 s
	m := &Metrics{
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "duration_seconds",
			Help: "SyncProxyRules latency in seconds", Buckets: buckets}),
		// Named like kube-proxy's (iptables and nftables modes): a full pass
		// here runs in steps between incremental syncs, so this is its wall
		// time from start to prune, not time the proxy was blocked.
		FullPassDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Subsystem: "sync_full_proxy_rules", Name: "duration_seconds",
			Help:    "Full pass (kernel read, drift repaired, stale objects pruned) duration in seconds, from start to end",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 18)}), // 10 ms … 22 min
		NetworkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "network_programming_duration_seconds",
			Help:    "In Cluster Network Programming Latency in seconds (from the oldest change queued to the kernel holding it)",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20)}),
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced"}),
		LastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued"}),
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
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy"}),
		RestoreFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "iptables_restore_failures_total",
			Help: "Cumulative proxy iptables restore failures"}),
		Syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ipvsproxy", Name: "syncs_total",
			Help: "Sync batches run, by kind: incremental (only changed services) or full (kernel read, drift repaired)"}, []string{"kind"}),
		SyncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "ipvsproxy", Name: "sync_failed_services_total",
			Help: "Service syncs that failed and were queued for retry"}),
		ServicesFailing: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ipvsproxy", Name: "services_sync_failing",
			Help: "Services whose last sync failed (a kernel write refused, a virtual server another Service holds); each is retried with backoff and has a Warning Event"}),
		KernelOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ipvsproxy", Name: "kernel_ops_total",
			Help: "Kernel writes by object, verb and result"}, []string{"object", "verb", "result"}),
		ServicesProgrammed: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ipvsproxy", Name: "services_programmed",
			Help: "Services with kernel state applied, as of the last full pass"}),
		Draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ipvsproxy", Name: "real_servers_draining",
			Help: "Real servers at weight 0 waiting for their connections to end"}),
		SetGrowths: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "ipvsproxy", Name: "ipset_growths_total",
			Help: "ipsets replaced by larger ones (filled, then swapped in atomically) because they had to hold more entries"}),
		ConntrackDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "ipvsproxy", Name: "conntrack_udp_entries_deleted_total",
			Help: "Stale UDP conntrack entries deleted after their backend went away"}),
	}
	if reg != nil {
		reg.MustRegister(m.SyncDuration, m.FullPassDuration, m.NetworkProgramming, m.LastSync, m.LastQueued,
			m.EndpointChanges, m.EndpointPending, m.ServiceChanges, m.ServicePending,
			m.NoLocalEndpoints, m.RestoreFailures, m.Syncs, m.SyncFailures, m.ServicesFailing, m.KernelOps,
			m.ServicesProgrammed, m.Draining, m.ConntrackDeleted, m.SetGrowths)
	}
	return m
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
	m.LastQueued.Set(float64(at.UnixNano()) / 1e9)
}

// synced records a batch. nodeOK: no node-wide step failed, so the batch
// counts as a sync even if some services failed (see processBatch).
func (m *Metrics) synced(full bool, start, end time.Time, queuedAt int64, failed int, nodeOK bool, stillQueued int) {
	kind := "incremental"
	if full {
		kind = "full"
	}
	m.Syncs.WithLabelValues(kind).Inc()
	m.SyncDuration.Observe(end.Sub(start).Seconds())
	m.SyncFailures.Add(float64(failed))
	if nodeOK {
		m.LastSync.Set(float64(end.UnixNano()) / 1e9)
		if queuedAt != 0 {
			m.NetworkProgramming.Observe(end.Sub(time.Unix(0, queuedAt)).Seconds())
		}
	}
	if stillQueued == 0 {
		m.EndpointPending.Set(0)
		m.ServicePending.Set(0)
	}
}

func (m *Metrics) fullPass(d time.Duration) { m.FullPassDuration.Observe(d.Seconds()) }

func (m *Metrics) noLocalEndpoints(byKey map[string]noLocal) {
	var internal, external int
	for _, nl := range byKey {
		if nl.internal {
			internal++
		}
		if nl.external {
			external++
		}
	}
	m.NoLocalEndpoints.WithLabelValues("internal").Set(float64(internal))
	m.NoLocalEndpoints.WithLabelValues("external").Set(float64(external))
}

func (m *Metrics) servicesFailing(n int) { m.ServicesFailing.Set(float64(n)) }

func (m *Metrics) draining(n int) { m.Draining.Set(float64(n)) }

func (m *Metrics) services(n int) { m.ServicesProgrammed.Set(float64(n)) }

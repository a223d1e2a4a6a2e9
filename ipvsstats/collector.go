// Package ipvsstats exports the kernel's per-virtual-server traffic
// counters as Prometheus metrics, labelled with the Service they belong
// to (kube-router's service metrics, under ipvsproxy's names).
//
// The counters are read on scrape, not on sync: the engine's hot path
// never lists the kernel. A scrape costs at most one ListVirtualServers,
// and its result is reused for a while so that several scrapers (or a
// fast one) do not multiply that cost; the number of series is capped.
package ipvsstats

import (
	"slices"
	"strconv"
	gosync "sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Lookup maps a virtual server to the Service that wants it. ok is false
// for a virtual server no Service wants: it is not ipvsproxy's, or it is
// stale, and is not exported. It must be safe for concurrent use.
type Lookup func(ipvs.ServiceKey) (namespace, name string, ok bool)

// DefaultCacheFor is how long one kernel dump answers scrapes.
const DefaultCacheFor = 10 * time.Second

var labels = []string{"namespace", "service_name", "vip", "protocol", "port"}

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("ipvsproxy_service_"+name, help, labels, nil)
}

var (
	descConns    = desc("connections_total", "Connections scheduled to the service's IPVS virtual server, from the kernel's counters")
	descPktsIn   = desc("packets_in_total", "Packets received by the service's IPVS virtual server")
	descPktsOut  = desc("packets_out_total", "Packets sent by the service's IPVS virtual server")
	descBytesIn  = desc("bytes_in_total", "Bytes received by the service's IPVS virtual server")
	descBytesOut = desc("bytes_out_total", "Bytes sent by the service's IPVS virtual server")
)

// Collector is a prometheus.Collector over the kernel's IPVS counters.
type Collector struct {
	ipvs     ipvs.Interface
	lookup   Lookup
	max      int
	cacheFor time.Duration
	now      func() time.Time

	mu      gosync.Mutex
	at      time.Time // when vss was read; zero: never
	vss     []ipvs.VirtualServer
	skipped int // series left out at the last collect, to log once per change
}

// New returns a Collector reading h. maxServices caps the virtual servers
// exported per scrape; beyond it the rest are skipped, in ipvsadm order,
// with a log line. A cap <= 0 exports nothing and reads nothing, as the
// --stats-max-services flag's 0 means.
func New(h ipvs.Interface, lookup Lookup, maxServices int) *Collector {
	return &Collector{ipvs: h, lookup: lookup, max: maxServices, cacheFor: DefaultCacheFor, now: time.Now}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConns, descPktsIn, descPktsOut, descBytesIn, descBytesOut} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.max <= 0 {
		return
	}
	n, skipped := 0, 0
	for _, vs := range c.read() {
		ns, name, ok := c.lookup(vs.ServiceKey)
		if !ok {
			continue
		}
		if n == c.max {
			skipped++
			continue
		}
		n++
		lv := []string{ns, name, vs.Address.String(), vs.Protocol.String(), strconv.Itoa(int(vs.Port))}
		for _, m := range []struct {
			d *prometheus.Desc
			v uint64
		}{
			{descConns, vs.Stats.Connections}, {descPktsIn, vs.Stats.PacketsIn}, {descPktsOut, vs.Stats.PacketsOut},
			{descBytesIn, vs.Stats.BytesIn}, {descBytesOut, vs.Stats.BytesOut},
		} {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, float64(m.v), lv...)
		}
	}
	c.mu.Lock()
	changed := skipped != c.skipped
	c.skipped = skipped
	c.mu.Unlock()
	if changed && skipped > 0 {
		klog.InfoS("Per-service IPVS metrics capped; some virtual servers are not exported (--stats-max-services)",
			"exported", n, "skipped", skipped)
	}
}

// read returns the virtual servers with their counters, listing the
// kernel at most once per cacheFor. Concurrent scrapes share one listing.
// A failed listing is logged and also cached, so a broken kernel read is
// not retried by every scrape.
func (c *Collector) read() []ipvs.VirtualServer {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if !c.at.IsZero() && now.Sub(c.at) < c.cacheFor {
		return c.vss
	}
	vss, err := c.ipvs.ListVirtualServers()
	if err != nil {
		klog.ErrorS(err, "Reading IPVS counters for the service metrics")
		vss = nil
	}
	// Sorted, so the cap keeps the same virtual servers from scrape to scrape.
	slices.SortFunc(vss, func(a, b ipvs.VirtualServer) int { return ipvs.CompareServiceKeys(a.ServiceKey, b.ServiceKey) })
	c.vss, c.at = vss, now
	return vss
}

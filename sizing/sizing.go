// Package sizing tells an operator when the kernel is sized too small for
// what ipvsproxy programs. Nothing here changes the kernel: the IPVS
// connection table size is a module parameter (ip_vs conn_tab_bits) fixed
// at load time, and the others are the operator's call. Each finding is
// logged once when it first appears and exported as a metric, so an alert
// can point at the node.
package sizing

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// Scale is what the proxy programs.
type Scale struct {
	VirtualServers int
	RealServers    int
}

// Kernel is what the node's kernel offers.
type Kernel struct {
	IPVSConnTableSize int // buckets of the IPVS connection hash (2^conn_tab_bits)
	ConntrackMax      int // net/netfilter/nf_conntrack_max
	RmemMax           int // net/core/rmem_max: the largest receive buffer a netlink socket may ask for
}

// Finding is one piece of advice.
type Finding struct {
	Setting string // what to change
	Have    int
	Want    int
	Why     string
}

func (f Finding) String() string {
	return fmt.Sprintf("%s is %d; at this scale use at least %d (%s)", f.Setting, f.Have, f.Want, f.Why)
}

// Advise compares the kernel with the scale. The thresholds are rules of
// thumb, written so that a default kernel with a few hundred services
// raises nothing:
//   - the IPVS connection table should have a bucket per 4 real servers'
//     worth of connections (≥ 4 × real servers, at least the 4,096 default)
//     or lookups walk long chains on every packet;
//   - conntrack should hold 32 connections per real server;
//   - a 100k-service full pass dumps tens of megabytes through netlink:
//     rmem_max should allow 8 MiB once there are 10,000 virtual servers.
func Advise(s Scale, k Kernel) []Finding {
	var out []Finding
	if want := 4 * s.RealServers; k.IPVSConnTableSize > 0 && want > 4096 && k.IPVSConnTableSize < want {
		out = append(out, Finding{"ip_vs conn_tab_bits (table size)", k.IPVSConnTableSize, roundPow2(want),
			"set the module parameter ip_vs.conn_tab_bits; it takes effect when ip_vs is loaded"})
	}
	if want := 32 * s.RealServers; k.ConntrackMax > 0 && k.ConntrackMax < want {
		out = append(out, Finding{"net.netfilter.nf_conntrack_max", k.ConntrackMax, want,
			"--conntrack-min or conntrack.min raises it at start"})
	}
	if want := 8 << 20; s.VirtualServers >= 10000 && k.RmemMax > 0 && k.RmemMax < want {
		out = append(out, Finding{"net.core.rmem_max", k.RmemMax, want,
			"full-pass netlink dumps of this many objects need large receive buffers"})
	}
	return out
}

func roundPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

var ipvsSize = regexp.MustCompile(`\(size=(\d+)\)`)

// ReadKernel reads the kernel's sizes; a value it cannot read is 0 (not
// judged).
func ReadKernel(sc sysctl.Interface, procIPVS string) Kernel {
	var k Kernel
	if b, err := os.ReadFile(procIPVS); err == nil {
		if m := ipvsSize.FindSubmatch(b); m != nil {
			k.IPVSConnTableSize, _ = strconv.Atoi(string(m[1]))
		}
	}
	k.ConntrackMax = readInt(sc, "net/netfilter/nf_conntrack_max")
	k.RmemMax = readInt(sc, "net/core/rmem_max")
	return k
}

func readInt(sc sysctl.Interface, name string) int {
	v, err := sc.Get(name)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(v))
	return n
}

// Reporter logs each finding once and exports them as
// ipvsproxy_kernel_sizing_advice{setting} (1 while the advice stands).
type Reporter struct {
	gauge  *prometheus.GaugeVec
	logged map[string]bool
}

// NewReporter registers the metric on reg (nil: unregistered).
func NewReporter(reg prometheus.Registerer) *Reporter {
	r := &Reporter{
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "ipvsproxy", Name: "kernel_sizing_advice",
			Help: "1 while a kernel setting is too small for the programmed scale (see the log for the advice)"}, []string{"setting"}),
		logged: map[string]bool{},
	}
	if reg != nil {
		reg.MustRegister(r.gauge)
	}
	return r
}

// Report publishes the findings of one check.
func (r *Reporter) Report(findings []Finding) {
	r.gauge.Reset()
	now := map[string]bool{}
	for _, f := range findings {
		now[f.Setting] = true
		r.gauge.WithLabelValues(f.Setting).Set(1)
		if !r.logged[f.Setting] {
			klog.InfoS("Kernel sizing advice: "+f.String(), "setting", f.Setting)
		}
	}
	r.logged = now
}

//go:build e2e

package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// row is one line of the table: a label and how to read the value (NaN:
// not measured) from a result.
type row struct {
	label string
	unit  string
	value func(r *result) float64
}

var rows = []row{
	{"initial programming: start → kernel complete", "s", func(r *result) float64 { return secs(r.Programmed) }},
	{"… the last look that found it incomplete (resolution)", "s", func(r *result) float64 { return secs(r.LastIncomplete) }},
	{"… of which every frontend sends to its backends (IPVS / nft chains)", "s", func(r *result) float64 { return secs(r.BackendsDone) }},
	{"start → first sync finished (the proxy's own metric)", "s", func(r *result) float64 { return secs(r.FirstSync) }},
	{"CPU during initial programming (incl. children)", "s", func(r *result) float64 { return r.InitCPU.CPUWithChildren }},
	{"one endpoint change, API write → kernel: p50", "ms", func(r *result) float64 { p, _ := percentiles(r.Latencies); return ms(p) }},
	{"one endpoint change, API write → kernel: p99", "ms", func(r *result) float64 { _, p := percentiles(r.Latencies); return ms(p) }},
	{"one endpoint change: max", "ms", func(r *result) float64 { return ms(maxOf(r.Latencies)) }},
	{"of which the API write (Update call): p50", "ms", func(r *result) float64 { p, _ := percentiles(r.APIWrites); return ms(p) }},
	{"one endpoint change, write returned → kernel: p50", "ms", func(r *result) float64 { p, _ := percentiles(r.AfterWrites); return ms(p) }},
	{"one endpoint change, write returned → kernel: p99", "ms", func(r *result) float64 { _, p := percentiles(r.AfterWrites); return ms(p) }},
	{"one service added, create → kernel sends to all endpoints: p50", "ms", func(r *result) float64 { p, _ := percentiles(r.ServiceAdds); return ms(p) }},
	{"one service deleted, delete → ClusterIP withdrawn: p50", "ms", func(r *result) float64 { p, _ := percentiles(r.ServiceDeletes); return ms(p) }},
	{"restart on the programmed node: start → a change shows", "s", func(r *result) float64 { return secs(r.Restart) }},
	{"CPU, whole run (process)", "s", func(r *result) float64 { return r.Total.CPUSeconds }},
	{"CPU, whole run (incl. children: iptables, ipset, nft)", "s", func(r *result) float64 { return r.Total.CPUWithChildren }},
	{"peak RSS (VmHWM)", "MB", func(r *result) float64 { return float64(r.Total.HWMKB) / 1024 }},
}

func secs(d time.Duration) float64 {
	if d <= 0 {
		return nan()
	}
	return d.Seconds()
}

func ms(d time.Duration) float64 {
	if d <= 0 {
		return nan()
	}
	return float64(d) / float64(time.Millisecond)
}

func maxOf(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return slices.Max(d)
}

func nan() float64 { var z float64; return z / z }

func fmtNum(v float64) string {
	switch {
	case v != v:
		return "–"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// ratioPairs lists the table's ratio columns as (proxy, baseline)
// indexes into res: each proxy after the first ÷ the first (how many
// times more time, CPU or memory it takes than ipvsproxy with the
// iptables backend, in the default order), then, when both ran and
// ipvsproxy-nftables is not the first, kube-proxy-nftables ÷
// ipvsproxy-nftables: the two proxies whose rules are nftables.
func ratioPairs(res []*result) [][2]int {
	var out [][2]int
	for i := 1; i < len(res); i++ {
		out = append(out, [2]int{i, 0})
	}
	idx := func(name string) int {
		return slices.IndexFunc(res, func(r *result) bool { return r.Proxy == name })
	}
	if k, i := idx(nameKubeProxyNFT), idx(nameIPVSProxyNFT); k >= 0 && i > 0 {
		out = append(out, [2]int{k, i})
	}
	return out
}

// renderTable is the Markdown table of one size: a column per proxy and
// a ratio column per ratioPairs pair.
// CPU and RSS of the whole run cover the endpoint changes and the
// service adds and deletes, not the restart.
func renderTable(n int, w *workload, rate float64, workers int, res []*result) string {
	var b strings.Builder
	vs, reals := 0, 0
	for _, r := range res {
		vs, reals = max(vs, r.VS), max(reals, r.Reals)
	}
	fmt.Fprintf(&b, "N = %d services (%d NodePort), 10 endpoints each: %d frontends, %d backends; "+
		"created at %.1f services/s (%d clients)\n\n", n, w.nodePorts(), vs, reals, rate, workers)
	pairs := ratioPairs(res)
	b.WriteString("| measure |")
	for _, r := range res {
		fmt.Fprintf(&b, " %s |", r.Proxy)
	}
	for _, p := range pairs {
		fmt.Fprintf(&b, " %s ÷ %s |", res[p[0]].Proxy, res[p[1]].Proxy)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(res)+len(pairs)) + "\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "| %s (%s) |", row.label, row.unit)
		for _, r := range res {
			fmt.Fprintf(&b, " %s |", fmtNum(row.value(r)))
		}
		for _, p := range pairs {
			fmt.Fprintf(&b, " %s× |", fmtNum(row.value(res[p[0]])/row.value(res[p[1]])))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "| changes measured / failed |")
	for _, r := range res {
		fmt.Fprintf(&b, " %d / %d |", len(r.Latencies), r.Failures)
	}
	b.WriteString(strings.Repeat(" |", len(pairs)) + "\n")
	for _, r := range res {
		if r.err != "" {
			fmt.Fprintf(&b, "\n%s: %s\n", r.Proxy, r.err)
		}
	}
	return b.String()
}

package app

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// nodeStartup does what kube-proxy does to the node before its sync loop:
// OOM score (a warning if it fails), conntrack sizing and timeouts (an
// error if a sysctl cannot be written, as in kube-proxy), and the node IP,
// found and logged once.
func nodeStartup(ctx context.Context, o *Options, client kubernetes.Interface, nodeName string) (nodeIP, error) {
	applyOOMScoreAdj(oomScoreAdjPath, o.OOMScoreAdj)
	if err := o.Conntrack.apply(sysctl.New(), &sysctl.Proc{Root: hashsizeDir}, numCPU()); err != nil {
		return nodeIP{}, fmt.Errorf("conntrack settings: %w", err)
	}
	return startupNodeIP(ctx, client, nodeName, o.BindAddress), nil
}

// processCPU is this process's user and system time so far: the
// start-up's log lines name it (sync.RunnerConfig.ProcessCPU).
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// canaryPollInterval is how often the firewall-reload monitor looks at the
// kernel; each look is one syscall per table, no process (iptables/canary.go).
const canaryPollInterval = time.Second

// startCanaryMonitor restores the fixed iptables rules within about a
// second after a firewall reload or "iptables -F/-X", counting each repair
// in ipvsproxy_iptables_canary_restores_total.
func startCanaryMonitor(ctx context.Context, reg prometheus.Registerer, rules []*iptables.Syncer) {
	restores := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ipvsproxy_iptables_canary_restores_total",
		Help: "Times the fixed iptables rules were restored after another program removed or changed them (firewall reload, iptables -F/-X), between periodic passes.",
	})
	reg.MustRegister(restores)
	m := &iptables.Monitor{Syncers: rules, Interval: canaryPollInterval, OnRestore: func(iptables.Family) { restores.Inc() }}
	go m.Run(ctx)
}

// startTableMonitor is startCanaryMonitor for the nftables backend: it
// restores the table's chains and rules within about a second after
// another program changed them (nft flush ruleset, a firewall reload),
// counting each repair in ipvsproxy_nftables_table_restores_total and
// each failed one as a sync failure. Each look reads nf_tables'
// generation, one netlink round trip; the structure is read only after
// it changed (nftrules/monitor.go).
func startTableMonitor(ctx context.Context, reg prometheus.Registerer, table nftrules.Syncer, gen func() (uint32, error), onFail func()) {
	restores := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ipvsproxy_nftables_table_restores_total",
		Help: "Times the nftables table's chains and rules were restored after another program removed or changed them (firewall reload, nft flush), between periodic passes.",
	})
	reg.MustRegister(restores)
	m := &nftrules.Monitor{Table: table, Generation: gen, Interval: canaryPollInterval,
		OnRestore: restores.Inc, OnFailure: onFail}
	go m.Run(ctx)
}

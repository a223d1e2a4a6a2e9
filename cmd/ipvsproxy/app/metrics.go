package app

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // rest_client_* through component-base's adapter, as kube-proxy (the runner's queue has no name, so no workqueue_*: sync/runner.go)
	_ "k8s.io/component-base/metrics/prometheus/version"  // kubernetes_build_info, as kube-proxy
)

// MetricsGatherer is what /metrics serves: ipvsproxy's own registry (the
// sync's kubeproxy_* and ipvsproxy_* metrics, health, sizing, canary,
// per-service stats) and component-base's legacy registry, which holds
// what every Kubernetes component exports: client-go's rest_client_*
// metrics, kubernetes_build_info and the Go and process collectors.
func MetricsGatherer(reg *prometheus.Registry) prometheus.Gatherer {
	return prometheus.Gatherers{reg, legacyregistry.DefaultGatherer}
}

// metricsHandler serves /metrics and, with profiling on, Go's pprof
// handlers under /debug/pprof/ (kube-proxy's enableProfiling).
func metricsHandler(reg *prometheus.Registry, profiling bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(MetricsGatherer(reg), promhttp.HandlerOpts{Registry: reg}))
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

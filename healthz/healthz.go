// Package healthz serves /healthz and /livez with kube-proxy's semantics,
// so existing probes and load-balancer health checks keep working, and
// /readyz, which kube-proxy does not have.
//
// /healthz is 200 while the proxy keeps up: nothing is pending, or the
// oldest pending change is younger than the timeout (kube-proxy: 2 ×
// syncPeriod), and the node is not being removed. A change is no longer
// pending once a sync batch holding it ran to its end, even if the kernel
// refused one Service's objects (that Service gets a Warning Event and is
// retried): one bad Service must not fail every node's probes. /livez ignores the node.
// Both answer 503 otherwise, with the same small JSON body. The body holds
// timestamps and booleans only: nothing secret is ever exposed.
//
// /readyz is 503 until the first full pass has completed — every service
// of the informers' initial lists programmed and the kernel's leftovers
// pruned — and 200 from then on: a node that joins a large cluster is
// not ready while it is still programming (the DaemonSet's readiness
// probe). It never turns back: after that, /healthz says whether the
// proxy keeps up.
package healthz

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Source tells the server how the proxy is doing.
type Source interface {
	// Pending returns when the oldest unsynced change was queued (zero when
	// none) and when the last sync batch without a node-wide failure ended.
	Pending() (queued, synced time.Time)
	// Ready reports whether the first full pass has completed.
	Ready() bool
}

// Server holds the health state and the handlers.
type Server struct {
	src     Source
	timeout time.Duration
	now     func() time.Time
	// NodeEligible, when set, reports whether this node still takes
	// traffic (false while it is being deleted or drained by the cluster
	// autoscaler); it affects /healthz only.
	NodeEligible func() bool

	healthzTotal *prometheus.CounterVec
	livezTotal   *prometheus.CounterVec
}

// New returns a Server that reports unhealthy once a change has waited
// longer than timeout. reg may be nil.
func New(src Source, timeout time.Duration, reg prometheus.Registerer) *Server {
	s := &Server{src: src, timeout: timeout, now: time.Now,
		healthzTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Name: "proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status"}, []string{"code"}),
		livezTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Name: "proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status"}, []string{"code"}),
	}
	if reg != nil {
		reg.MustRegister(s.healthzTotal, s.livezTotal)
	}
	return s
}

type status struct {
	LastUpdated  string `json:"lastUpdated"`
	CurrentTime  string `json:"currentTime"`
	NodeEligible *bool  `json:"nodeEligible,omitempty"`
	Ready        *bool  `json:"ready,omitempty"` // /readyz only
}

// healthy reports whether syncs keep up, and when the last one ended.
func (s *Server) healthy(now time.Time) (bool, time.Time) {
	queued, synced := s.src.Pending()
	if queued.IsZero() || !synced.IsZero() && synced.After(queued) {
		return true, synced
	}
	return now.Sub(queued) <= s.timeout, synced
}

// Healthy reports whether syncs keep up (the /livez condition).
func (s *Server) Healthy() bool {
	ok, _ := s.healthy(s.now())
	return ok
}

// Handler returns the mux with /healthz, /livez and /readyz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		now := s.now()
		ok, synced := s.healthy(now)
		eligible := true
		if s.NodeEligible != nil {
			eligible = s.NodeEligible()
		}
		st := status{LastUpdated: synced.Format(time.RFC3339Nano), CurrentTime: now.Format(time.RFC3339Nano), NodeEligible: &eligible}
		s.write(w, s.healthzTotal, ok && eligible, st)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		now := s.now()
		ok, synced := s.healthy(now)
		s.write(w, s.livezTotal, ok, status{LastUpdated: synced.Format(time.RFC3339Nano), CurrentTime: now.Format(time.RFC3339Nano)})
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		now := s.now()
		_, synced := s.src.Pending()
		ready := s.src.Ready()
		s.write(w, nil, ready, status{LastUpdated: synced.Format(time.RFC3339Nano), CurrentTime: now.Format(time.RFC3339Nano), Ready: &ready})
	})
	return mux
}

func (s *Server) write(w http.ResponseWriter, total *prometheus.CounterVec, ok bool, st status) {
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	if total != nil { // kube-proxy counts /healthz and /livez only
		total.WithLabelValues(strconv.Itoa(code)).Inc()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}

package app

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestProfilingServedOnlyWhenEnabled: /debug/pprof/ exists on the metrics
// server with --profiling (kube-proxy's enableProfiling) and not without.
func TestProfilingServedOnlyWhenEnabled(t *testing.T) {
	for _, on := range []bool{false, true} {
		h := metricsHandler(prometheus.NewRegistry(), on)
		get := func(path string) (int, string) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			return rec.Code, rec.Body.String()
		}
		if code, _ := get("/metrics"); code != http.StatusOK {
			t.Errorf("profiling=%v: /metrics answered %d", on, code)
		}
		code, body := get("/debug/pprof/heap?debug=1")
		switch {
		case on && (code != http.StatusOK || !strings.Contains(body, "heap profile")):
			t.Errorf("profiling on: /debug/pprof/heap answered %d: %.80s", code, body)
		case !on && code != http.StatusNotFound:
			t.Errorf("profiling off: /debug/pprof/heap answered %d, want 404", code)
		}
	}
}

package healthz

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

type fakeSource struct{ queued, synced time.Time }

func (f *fakeSource) Pending() (time.Time, time.Time) { return f.queued, f.synced }

func TestHealthzFollowsKubeProxySemantics(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name           string
		queued, synced time.Time
		now            time.Time
		eligible       bool
		healthz, livez int
	}{
		{"nothing pending", time.Time{}, t0, t0.Add(time.Hour), true, 200, 200},
		{"synced after the change", t0, t0.Add(time.Second), t0.Add(time.Hour), true, 200, 200},
		{"pending, within timeout", t0, time.Time{}, t0.Add(59 * time.Second), true, 200, 200},
		{"pending past timeout", t0, t0.Add(-time.Second), t0.Add(61 * time.Second), true, 503, 503},
		{"node being deleted", time.Time{}, t0, t0, false, 503, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := New(&fakeSource{c.queued, c.synced}, 60*time.Second, nil)
			s.now = func() time.Time { return c.now }
			s.NodeEligible = func() bool { return c.eligible }
			for path, want := range map[string]int{"/healthz": c.healthz, "/livez": c.livez} {
				rec := httptest.NewRecorder()
				s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != want {
					t.Errorf("%s: %d, want %d (body %s)", path, rec.Code, want, rec.Body)
				}
				if !strings.Contains(rec.Body.String(), `"currentTime":"`+c.now.Format(time.RFC3339Nano)) {
					t.Errorf("%s body lacks currentTime: %s", path, rec.Body)
				}
			}
		})
	}
}

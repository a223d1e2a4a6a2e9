package healthz

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

type fakeSource struct {
	queued, synced time.Time
	ready          bool
}

func (f *fakeSource) Pending() (time.Time, time.Time) { return f.queued, f.synced }
func (f *fakeSource) Ready() bool                     { return f.ready }

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
			s := New(&fakeSource{queued: c.queued, synced: c.synced}, 60*time.Second, nil)
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

// TestReadyzFollowsTheFirstFullPass: /readyz is 503 until the first full
// pass has completed and 200 from then on, whatever /healthz says, with
// the same small JSON body.
func TestReadyzFollowsTheFirstFullPass(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		src     fakeSource
		code    int
		body    string
		healthz int
	}{
		{"programming: the first pass runs", fakeSource{synced: t0}, 503, `"ready":false`, 200},
		{"first pass done", fakeSource{synced: t0, ready: true}, 200, `"ready":true`, 200},
		{"ready, then falling behind: /healthz says so, not /readyz", fakeSource{queued: t0.Add(-time.Hour), synced: t0.Add(-2 * time.Hour), ready: true}, 200, `"ready":true`, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(&c.src, time.Minute, nil)
			s.now = func() time.Time { return t0 }
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			for path, want := range map[string]int{"/readyz": c.code, "/healthz": c.healthz} {
				resp, err := http.Get(srv.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("%s: %d, want %d (body %s)", path, resp.StatusCode, want, body)
				}
				if path != "/readyz" {
					continue
				}
				var st map[string]any
				if err := json.Unmarshal(body, &st); err != nil || resp.Header.Get("Content-Type") != "application/json" {
					t.Fatalf("/readyz body %q (%s): %v", body, resp.Header.Get("Content-Type"), err)
				}
				if !strings.Contains(string(body), c.body) || st["currentTime"] != t0.Format(time.RFC3339Nano) || st["lastUpdated"] == nil {
					t.Errorf("/readyz body %s, want %s with currentTime and lastUpdated", body, c.body)
				}
			}
		})
	}
}

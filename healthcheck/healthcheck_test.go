package healthcheck

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// loopback opens each health-check port as an ephemeral loopback port and
// remembers where, so tests can reach it without privileged ports.
type loopback struct{ addrs map[uint16]string }

func (l *loopback) listen(port uint16) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err == nil {
		l.addrs[port] = ln.Addr().String()
	}
	return ln, err
}

func get(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func TestHealthCheckNodePort(t *testing.T) {
	lb := &loopback{addrs: map[uint16]string{}}
	s := NewWithListen(lb.listen)
	defer s.Close()
	healthy := true
	s.ProxyHealthy = func() bool { return healthy }

	if err := s.Update("default/web", 32000, 2); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, lb.addrs[32000])
	if code != 200 || body != `{"service":{"namespace":"default","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}` {
		t.Errorf("with local endpoints: %d %s", code, body)
	}
	must(t, s.Update("default/web", 32000, 0))
	if code, body = get(t, lb.addrs[32000]); code != 503 || !strings.Contains(body, `"localEndpoints":0`) {
		t.Errorf("without local endpoints: %d %s", code, body)
	}
	must(t, s.Update("default/web", 32000, 1))
	healthy = false
	if code, body = get(t, lb.addrs[32000]); code != 503 || !strings.Contains(body, `"serviceProxyHealthy":false`) {
		t.Errorf("proxy unhealthy: %d %s", code, body)
	}
	healthy = true

	if err := s.Update("other/svc", 32000, 1); err == nil {
		t.Error("a second service on the same port must be refused")
	}
	// Moving to another port closes the old server.
	must(t, s.Update("default/web", 32001, 1))
	if _, err := http.Get("http://" + lb.addrs[32000] + "/"); err == nil {
		t.Error("old port still answers after the service moved")
	}
	must(t, s.Update("default/web", 0, 0))
	if got := fmt.Sprint(s.Ports()); got != "map[]" {
		t.Errorf("ports after removal: %s", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

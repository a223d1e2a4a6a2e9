package sync

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

var (
	webVS = ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.TCP, Port: 80}
	podA  = ipvs.RealKey{Address: netip.MustParseAddr("10.244.1.1"), Port: 80}
	podB  = ipvs.RealKey{Address: netip.MustParseAddr("10.244.1.2"), Port: 80}
)

type drainClock struct{ t time.Time }

func (c *drainClock) now() time.Time { return c.t }

func drainingEngine(t *testing.T) (*kernel, *engine, *drainClock) {
	k := newKernel(t)
	e := newEngine(t, k)
	c := &drainClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	e.rec.drain.now = c.now
	e.rec.SetGracePeriod(30 * time.Second)
	return k, e, c
}

func webWith(ips ...string) (*v1.Service, []ep) {
	var eps []ep
	for _, ip := range ips {
		eps = append(eps, ep{ip: ip})
	}
	return svc("default", "web", "10.96.0.10", "80"), eps
}

func applyWeb(e *engine, ips ...string) {
	s, eps := webWith(ips...)
	e.apply(s, slice("default", "web", "w", "", 80, v1.ProtocolTCP, eps...))
}

func TestRemovedTCPBackendDrainsUntilConnectionsEnd(t *testing.T) {
	k, e, c := drainingEngine(t)
	applyWeb(e, "10.244.1.1", "10.244.1.2")
	must(t, k.IPVS.SetConns(webVS, podB, 2, 1))
	applyWeb(e, "10.244.1.1")
	assertText(t, "ipvsadm -Sn while draining", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.1:80 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.1.2:80 -m -w 0
`)
	c.t = c.t.Add(10 * time.Second)
	must(t, e.rec.SweepDraining())
	if e.rec.Draining() != 1 {
		t.Fatal("a backend with open connections was removed before its grace period")
	}
	must(t, k.IPVS.SetConns(webVS, podB, 0, 0))
	must(t, e.rec.SweepDraining())
	if e.rec.Draining() != 0 || k.IPVS.String() != "-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.1.1:80 -m -w 1\n" {
		t.Errorf("after the last connection ended: draining %d\n%s", e.rec.Draining(), k.IPVS.String())
	}
}

func TestDrainEndsAtGracePeriod(t *testing.T) {
	k, e, c := drainingEngine(t)
	applyWeb(e, "10.244.1.1", "10.244.1.2")
	must(t, k.IPVS.SetConns(webVS, podB, 5, 0))
	applyWeb(e, "10.244.1.1")
	c.t = c.t.Add(31 * time.Second)
	k.ResetCounts()
	must(t, e.rec.SweepDraining())
	if got := fmt.Sprint(k.writes()); got != "map[DeleteRealServer:1]" || e.rec.Draining() != 0 {
		t.Errorf("past the grace period: writes %s, draining %d", got, e.rec.Draining())
	}
}

func TestDrainingBackendThatReturnsGetsItsWeightBack(t *testing.T) {
	k, e, _ := drainingEngine(t)
	applyWeb(e, "10.244.1.1", "10.244.1.2")
	must(t, k.IPVS.SetConns(webVS, podB, 1, 0))
	applyWeb(e, "10.244.1.1")
	applyWeb(e, "10.244.1.1", "10.244.1.2")
	if e.rec.Draining() != 0 {
		t.Error("still draining after the endpoint came back")
	}
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.1:80 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.1.2:80 -m -w 1
`)
}

// TestDrainSurvivesRestart: a new process finds a weight-0 backend nobody
// wants and keeps draining it; a weight-0 backend a service wants gets its
// weight back (kube-proxy #92019, #108319).
func TestDrainSurvivesRestart(t *testing.T) {
	k, e, _ := drainingEngine(t)
	applyWeb(e, "10.244.1.1", "10.244.1.2")
	must(t, k.IPVS.SetConns(webVS, podB, 1, 0))
	applyWeb(e, "10.244.1.1")
	must(t, k.IPVS.UpdateRealServer(webVS, ipvs.RealServer{RealKey: podA, Weight: 0})) // a stuck weight

	restarted := newEngine(t, k)
	restarted.rec.SetGracePeriod(30 * time.Second)
	restarted.services, restarted.slices = e.services, e.slices
	restarted.full()
	assertText(t, "ipvsadm -Sn after restart", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.1:80 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.1.2:80 -m -w 0
`)
	if restarted.rec.Draining() != 1 {
		t.Errorf("restarted process should be draining 10.244.1.2, draining %d", restarted.rec.Draining())
	}
}

func TestUDPBackendRemovedAtOnceWithStaleFlows(t *testing.T) {
	k, e, _ := drainingEngine(t)
	s := svc("kube-system", "dns", "10.96.0.53", "53/UDP")
	e.apply(s)
	e.rec.TakeStaleFlows()
	// 0 → 1 endpoints: entries cached while there was no backend go.
	e.apply(s, slice("kube-system", "dns", "d", "", 5353, v1.ProtocolUDP, ep{ip: "10.244.1.1"}))
	if got := fmt.Sprintf("%+v", e.rec.TakeStaleFlows()); got != "[{Destination:10.96.0.53 Port:53 NodePort:false Backend:invalid IP}]" {
		t.Errorf("0 → 1 endpoints: %s", got)
	}
	e.apply(s, slice("kube-system", "dns", "d", "", 5353, v1.ProtocolUDP, ep{ip: "10.244.1.2"}))
	if got := fmt.Sprintf("%+v", e.rec.TakeStaleFlows()); got != "[{Destination:10.96.0.53 Port:53 NodePort:false Backend:10.244.1.1}]" {
		t.Errorf("backend replaced: %s", got)
	}
	if e.rec.Draining() != 0 || k.IPVS.Count("DeleteRealServer") != 1 {
		t.Errorf("UDP backends are deleted at once, not drained")
	}
}

package sync

import (
	"context"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// weightedService is a wrr Service with four backends: two in zone-a, one
// in zone-b, and one in zone-b on node big-1.
func weightedService(weights string) (*v1.Service, *discovery.EndpointSlice) {
	s := svc("default", "web", "10.96.0.10", "80")
	s.Annotations = map[string]string{AnnotationScheduler: "wrr", AnnotationWeights: weights}
	sl := slice("default", "web", "w", "", 8080, v1.ProtocolTCP,
		ep{ip: "10.244.1.1", node: "small-1"}, ep{ip: "10.244.1.2", node: "small-2"},
		ep{ip: "10.244.2.1", node: "small-3"}, ep{ip: "10.244.2.2", node: "big-1"})
	for i, z := range []string{"zone-a", "zone-a", "zone-b", "zone-b"} {
		sl.Endpoints[i].Zone = ptr.To(z)
	}
	return s, sl
}

// weightsOf returns the weight of each real server of 10.96.0.10:80 in
// ipvsadm -Sn, by address.
func weightsOf(k *kernel) string {
	var out []string
	for _, line := range strings.Split(k.IPVS.String(), "\n") {
		if f := strings.Fields(line); len(f) >= 7 && f[0] == "-a" {
			out = append(out, strings.TrimSuffix(f[4], ":8080")+"="+f[len(f)-1])
		}
	}
	return strings.Join(out, " ")
}

// TestWeightsAnnotation: each real server gets the weight of its node's
// term, else of its zone's, else 1; the informer's transform keeps what
// that needs (the annotation, every endpoint's zone and node name).
func TestWeightsAnnotation(t *testing.T) {
	for _, c := range []struct{ weights, want string }{
		{"zone=zone-a:3,zone=zone-b:1", "10.244.1.1=3 10.244.1.2=3 10.244.2.1=1 10.244.2.2=1"},
		{"zone=zone-a:3, node=big-1:4", "10.244.1.1=3 10.244.1.2=3 10.244.2.1=1 10.244.2.2=4"},
		{"node=big-1:65535,zone=zone-b:2", "10.244.1.1=1 10.244.1.2=1 10.244.2.1=2 10.244.2.2=65535"},
		{"", "10.244.1.1=1 10.244.1.2=1 10.244.2.1=1 10.244.2.2=1"},
	} {
		k := newKernel(t)
		e := newEngine(t, k)
		s, sl := weightedService(c.weights)
		strip := StripForProxy(testNode, CriticalServices{})
		strip(s)
		strip(sl)
		if p := Build(s, proxySlices(sl), &e.cfg).Problems; len(p) != 0 {
			t.Errorf("%q: problems %q", c.weights, p)
		}
		e.apply(s, sl)
		if got := weightsOf(k); got != c.want {
			t.Errorf("%q: weights %s, want %s", c.weights, got, c.want)
		}
	}
}

// TestWeightsChangeIncrementally: changing one zone's weight updates that
// zone's real servers in place and writes nothing else.
func TestWeightsChangeIncrementally(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(weightedService("zone=zone-a:3,node=big-1:4"))
	k.ResetCounts()
	e.apply(weightedService("zone=zone-a:2,node=big-1:4"))
	if got := fmt.Sprint(k.writes()); got != "map[UpdateRealServer:2]" {
		t.Errorf("changing zone-a's weight wrote %s, want the two zone-a real servers updated", got)
	}
	if got, want := weightsOf(k), "10.244.1.1=2 10.244.1.2=2 10.244.2.1=1 10.244.2.2=4"; got != want {
		t.Errorf("weights %s, want %s", got, want)
	}
}

// TestBadWeightsWarnAndFallBack: a bad annotation gets one Warning Event
// saying what is wrong, and every real server weight 1; weights with a
// scheduler that ignores them are applied and warned about.
func TestBadWeightsWarnAndFallBack(t *testing.T) {
	for _, c := range []struct{ sched, weights, event, want string }{
		{"wrr", "zone=zone-a:3,zone=zone-b:x", `"zone=zone-b:x": weight "x" is not a whole number from 1 to 65535`, "1 1 1 1"},
		{"wrr", "zone=zone-a:0", `weight "0" is not a whole number`, "1 1 1 1"},
		{"wrr", "zone=zone-a:70000", `weight "70000" is not a whole number`, "1 1 1 1"},
		{"wrr", "rack=r1:2", `weights are by zone or node, not "rack"`, "1 1 1 1"},
		{"wrr", "zone=:2", `"zone=:2" names no zone`, "1 1 1 1"},
		{"wrr", "zone=zone-a", `"zone=zone-a" is not zone=ZONE:WEIGHT or node=NODE:WEIGHT`, "1 1 1 1"},
		{"wrr", "zone=zone-a:2,zone=zone-a:3", `zone "zone-a" is given a weight twice`, "1 1 1 1"},
		{"rr", "zone=zone-a:3", `scheduler "rr" ignores weights`, "3 3 1 1"},
	} {
		k := newKernel(t)
		e := newEngine(t, k)
		events := &recordedEvents{}
		tracker := NewTracker()
		runner := NewRunner(RunnerConfig{Build: testConfig, Events: events}, tracker, e.rec)
		runner.informersSynced.Store(true)
		s, sl := weightedService(c.weights)
		s.Annotations[AnnotationScheduler] = c.sched
		tracker.ServiceHandler().OnAdd(s, true)
		tracker.EndpointSliceHandler().OnAdd(sl, true)
		runner.next(context.Background())
		ev := events.list()
		if len(ev) != 1 || !strings.Contains(ev[0], "IPVSProxyInvalidService: annotation "+AnnotationWeights+": ") || !strings.Contains(ev[0], c.event) {
			t.Errorf("%s %q: events %q, want one saying %s", c.sched, c.weights, ev, c.event)
		}
		var got []string
		for _, w := range strings.Fields(weightsOf(k)) {
			got = append(got, w[strings.IndexByte(w, '=')+1:])
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s %q: weights %v, want %s", c.sched, c.weights, got, c.want)
		}
	}
}

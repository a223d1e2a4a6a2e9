//go:build e2e

package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestSpareAddressesAreNobodys: the addresses a "replace" change gives an
// endpoint are routed (10.128.0.0/12, never .0 or .255) and map back to
// no service, so a leftover one would show in the checks as wrong; the
// plan's end stops them.
func TestSpareAddressesAreNobodys(t *testing.T) {
	w, err := newWorkload(2000, 50, 1, "node-a", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	ch := &changer{w: w}
	for k := 0; k < 3000; k++ {
		v, ok := ch.spareAddr()
		a := vAddr(v)
		if !ok || !netip.MustParsePrefix("10.128.0.0/12").Contains(a) || a.As4()[3] == 0 || a.As4()[3] == 255 {
			t.Fatalf("spare %d: %s %v", k, a, ok)
		}
		if _, known := w.serviceOfEndpoint(v); known {
			t.Fatalf("spare %d (%s) maps to a service", k, a)
		}
	}
	full := &changer{w: &workload{n: maxServices}}
	n := 0
	for ; n < 10; n++ {
		if _, ok := full.spareAddr(); !ok {
			break
		}
	}
	if n != 4 { // (1<<20)/256*254 − maxServices×10
		t.Errorf("at the plan's size, %d spare addresses; want 4", n)
	}
}

// TestChangesReachInformerAndRestore: the changes written through the
// fake reach an informer over the API server as the slice they wrote,
// never to a sampled or NodePort service; the restore writes every
// original back.
func TestChangesReachInformerAndRestore(t *testing.T) {
	w, srv, client := served(t, 1200)
	u := runSliceInformer(t, client, true)
	ch := &changer{w: w, cs: srv.cs, begin: time.Now(), rng: rand.New(rand.NewPCG(1, 2)), orig: map[int]*discoveryv1.EndpointSlice{}}
	for k := 0; k < 12; k++ {
		i, want, res, err := ch.write(k)
		if err != nil {
			t.Fatal(err)
		}
		if _, sampled := w.sampleSlot[i]; sampled || nodePort(i) != 0 {
			t.Fatalf("change %d picked service %d (sampled %v, node port %d)", k, i, sampled, nodePort(i))
		}
		wantKind, wantN := "replace", endpointsPer
		if k%2 == 1 {
			wantKind, wantN = "unready", endpointsPer-1
		}
		if res.Kind != wantKind || len(want) != wantN {
			t.Fatalf("change %d: %s with %d in service, want %s with %d", k, res.Kind, len(want), wantKind, wantN)
		}
		key := namespace(i) + "/" + serviceName(i) + "-x7k2p"
		waitFor(t, "change "+fmt.Sprint(k), func() bool { es := u.seen(key); return es != nil && reflect.DeepEqual(readyAddrs(es), want) })
	}
	left, err := ch.restore()
	if err != nil || len(left) != 12 {
		t.Fatalf("restore: %d services, %v", len(left), err)
	}
	for i, want := range left {
		if len(want) != endpointsPer {
			t.Errorf("service %d restored with %d in service", i, len(want))
		}
		key := namespace(i) + "/" + serviceName(i) + "-x7k2p"
		waitFor(t, "restore of "+key, func() bool {
			es := u.seen(key)
			return es != nil && reflect.DeepEqual(es.Endpoints, w.slice(w.service(i, es.CreationTimestamp), i, es.CreationTimestamp).Endpoints)
		})
	}
}

func TestInService(t *testing.T) {
	want := map[uint32]bool{1: true, 2: true}
	for _, c := range []struct {
		reals        []realServer
		loose, exact bool
		name         string
	}{
		{[]realServer{{1, targetPort, 1}, {2, targetPort, 1}}, true, true, "exactly"},
		{[]realServer{{1, targetPort, 1}, {2, targetPort, 1}, {3, targetPort, 0}}, true, false, "one draining"},
		{[]realServer{{1, targetPort, 1}}, false, false, "one missing"},
		{[]realServer{{1, targetPort, 1}, {2, targetPort, 1}, {3, targetPort, 1}}, false, false, "one too many"},
		{[]realServer{{1, targetPort, 1}, {2, targetPort, 0}}, false, false, "a wanted one at weight 0"},
		{[]realServer{{1, targetPort, 1}, {2, 80, 1}}, false, false, "a wrong port"},
	} {
		if got := inService(c.reals, want, false); got != c.loose {
			t.Errorf("%s: in service %v, want %v", c.name, got, c.loose)
		}
		if got := inService(c.reals, want, true); got != c.exact {
			t.Errorf("%s: exact %v, want %v", c.name, got, c.exact)
		}
	}
}

// TestClassifyByLoggedPasses: passes from the proxy's "Full pass done"
// lines (time − duration), changes sorted into them.
func TestClassifyByLoggedPasses(t *testing.T) {
	launched := time.Date(2026, 12, 2, 6, 0, 0, 0, time.Local)
	log := `I1202 05:59:59.000000     1 main.go:1] "old run"
===== bench100k: starting ipvsproxy
I1202 06:00:09.000000     183 fullsync.go:80] "Full pass read the kernel" took="612ms" longestRead="virtual servers" longestReadTook="301.5ms"
I1202 06:00:10.500000     183 batch.go:303] "Full pass done" services=2002 adopted=0 failed=0 duration="2.5s"
I1202 06:00:20.000000     183 batch.go:303] "Other"
I1202 06:01:00.000000     183 batch.go:303] "Full pass done" services=2002 adopted=0 failed=0 duration="1m0s"
`
	passes := parsePasses(log, launched)
	if len(passes) != 2 || passes[0] != (passSpan{8, 10.5, "virtual servers", 301.5}) || passes[1] != (passSpan{0, 60, "", 0}) {
		t.Fatalf("passes %v", passes)
	}
	if p := longestRead(passes); p.LongestRead != "virtual servers" {
		t.Errorf("longest read %v", p)
	}
	passes = []passSpan{{StartSeconds: 8, EndSeconds: 10.5}, {StartSeconds: 30, EndSeconds: 60}}
	for _, c := range []struct {
		t    float64
		want string
	}{{5, classBetween}, {9, classDuring}, {20, classBetween}, {30, classDuring}, {60.5, classUnknown}} {
		if got := classify(c.t, passes); got != c.want {
			t.Errorf("written at %v: %s, want %s", c.t, got, c.want)
		}
	}
	var ms []float64
	for k := 100; k >= 1; k-- {
		ms = append(ms, float64(k))
	}
	if s := stats(ms); s != (latencyStats{Count: 100, P50Ms: 50, P99Ms: 99, MaxMs: 100}) {
		t.Errorf("stats %v", s)
	}
	if s := stats(nil); s.Count != 0 {
		t.Errorf("no latencies: %v", s)
	}
}

// TestChangesMarkdown: the summary's table and the target's verdict.
func TestChangesMarkdown(t *testing.T) {
	r := &report{}
	if md := r.markdown(); !strings.Contains(md, "Change latency during full passes (issue 20): not measured") {
		t.Errorf("no changes: %s", md)
	}
	ch := &changer{results: []changeResult{{WrittenSeconds: 9, LatencyMs: 40, MaxPollGapMs: 6}, {WrittenSeconds: 20, LatencyMs: 250, MaxPollGapMs: 180.5}}, restoreSeconds: 3}
	r.Changes = ch.report("/nonexistent")
	r.Changes.Passes = []passSpan{{StartSeconds: 8, EndSeconds: 10.5, LongestRead: "KUBE-CLUSTER-IP", LongestReadMs: 42}}
	if r.Changes.Target != "not checked (no change during a pass)" || r.Changes.Unclassified.Count != 2 || r.Changes.Error == "" {
		t.Errorf("without a log: %+v", r.Changes)
	}
	md := r.markdown()
	for _, want := range []string{"| during a pass | 0 |", "| unclassified (after the last pass logged as ended) | 2 | 40.0 | 250.0 | 250.0 |", "| stopped early | proxy log: ",
		"| longest kernel read of a pass (one dump; since 97960ff beside the sync loop, before a change waited for it) | 42 ms (KUBE-CLUSTER-IP) |",
		"| the slowest change (unclassified): its longest gap between two polls (every 5 ms: a longer gap means the guest held the benchmark up too) | 250.0 ms: 180.5 ms |"} {
		if !strings.Contains(md, want) {
			t.Errorf("summary lacks %q:\n%s", want, md)
		}
	}
}

// TestSlowChangesSplitByTheProxysLine: a slow change during a pass is
// matched to the "Synced changes" line of the batch that had it first
// (not another service's, not one logged before its write) and split into
// delivery, wait, batch and the rest; one no batch had first says so.
func TestSlowChangesSplitByTheProxysLine(t *testing.T) {
	launched := time.Date(2026, 12, 3, 18, 0, 0, 0, time.Local)
	log := `===== bench100k: starting ipvsproxy
I1203 18:00:10.050000     110 batch.go:120] "Synced changes" services=1 first="ns/svc-7" waited="1ms" took="2ms"
I1203 18:00:20.100000     110 batch.go:120] "Synced changes" services=1 first="ns/svc-9" waited="5ms" took="20ms"
I1203 18:00:20.160000     110 batch.go:120] "Synced changes" services=2 first="ns/svc-7" waited="30ms" took="60ms"
I1203 18:00:25.000000     110 fullsync.go:80] "Full pass read the kernel" took="1s" longestRead="virtual servers" longestReadTook="1s"
I1203 18:01:00.000000     110 runpass.go:73] "Full pass done" services=2 adopted=2 failed=0 duration="55s"
`
	path := t.TempDir() + "/ipvsproxy.log"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	ch := &changer{begin: launched, results: []changeResult{
		{Service: "ns/svc-7", WrittenSeconds: 20.04, LatencyMs: 130},
		{Service: "ns/svc-8", WrittenSeconds: 30, LatencyMs: 150},
		{Service: "ns/svc-9", WrittenSeconds: 40, LatencyMs: 20},
	}}
	c := ch.report(path)
	s := c.List[0].Split
	if s == nil || s.DeliveredMs != 30 || s.WaitedMs != 30 || s.BatchMs != 60 || s.AfterMs != 10 {
		t.Fatalf("svc-7's split %+v, want delivered 30, waited 30, batch 60, after 10", s)
	}
	if c.List[1].Split != nil || c.List[2].Split != nil {
		t.Errorf("splits of changes no batch after their write had first: %+v %+v", c.List[1].Split, c.List[2].Split)
	}
	var b strings.Builder
	c.slowChangesMarkdown(&b)
	for _, want := range []string{"| 20.0 | 130.0 | 30.0 | 30.0 | 60.0 | 10.0 | 0.0 |", "| 30.0 | 150.0 | no batch logged it first | | | | 0.0 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "| 40.0 |") {
		t.Errorf("a change under the target is in the table:\n%s", b.String())
	}
}

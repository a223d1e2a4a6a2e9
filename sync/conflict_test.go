package sync

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	v1 "k8s.io/api/core/v1"
)

// A Service whose externalIP:port is another Service's ClusterIP:port
// writes nothing for that virtual server: no virtual server, no
// KUBE-EXTERNAL-IP entry (which would change how the kernel treats the
// other Service's traffic), and no hold on the address, which goes with
// its owner. Its other ports on that address work. Once the owner is
// gone, the retry takes the address over.
func TestConflictWritesNothingForTheOwnersAddress(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(svc("team-a", "a", "10.96.0.10", "80"), slice("team-a", "a", "a", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.1"}))

	b := svc("team-b", "b", "10.96.0.20", "80")
	b.Spec.ExternalIPs = []string{"10.96.0.10"}
	e.services["team-b/b"] = b
	err := e.rec.Sync("team-b/b", e.want("team-b/b"))
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("want ErrConflict, got %v", err)
	}
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.1:80 -m -w 1
-A -t 10.96.0.20:80 -s rr
`)
	assertText(t, "ipset entries", k.ipsetEntries(), `
add KUBE-CLUSTER-IP 10.96.0.10,tcp:80
add KUBE-CLUSTER-IP 10.96.0.20,tcp:80
add KUBE-IPVS-IPS 10.96.0.10
add KUBE-IPVS-IPS 10.96.0.20
`)
	// A full pass neither adopts nor writes the conflicting objects.
	want := map[string]*ServiceState{"team-a/a": e.want("team-a/a"), "team-b/b": e.want("team-b/b")}
	if res, _ := fullSync(e.rec, want); !errors.Is(res.Failed["team-b/b"], ErrConflict) || res.Prune != nil {
		t.Fatalf("full pass: %+v", res)
	}
	if got := k.ipsetEntries(); strings.Contains(got, "KUBE-EXTERNAL-IP") {
		t.Errorf("the full pass wrote the loser's entries:\n%s", got)
	}

	e.remove("team-a/a")
	if got := k.Dummy.Addresses(); len(got) != 1 || got[0] != netip.MustParseAddr("10.96.0.20") {
		t.Errorf("kube-ipvs0 after the owner is deleted: %v; want only 10.96.0.20", got)
	}
	if err := e.rec.Sync("team-b/b", e.want("team-b/b")); err != nil {
		t.Fatalf("retry once the owner is gone: %v", err)
	}
	assertText(t, "ipset entries once free", k.ipsetEntries(), `
add KUBE-CLUSTER-IP 10.96.0.20,tcp:80
add KUBE-EXTERNAL-IP 10.96.0.10,tcp:80
add KUBE-IPVS-IPS 10.96.0.10
add KUBE-IPVS-IPS 10.96.0.20
`)
}

// Only the conflicting virtual server is withheld: another port of the
// same external IP is programmed, with the address bound once for both
// Services.
func TestConflictKeepsOtherPortsOfTheAddress(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(svc("team-a", "a", "10.96.0.10", "80"))
	b := svc("team-b", "b", "10.96.0.20", "80", "8080")
	b.Spec.ExternalIPs = []string{"10.96.0.10"}
	e.services["team-b/b"] = b
	if err := e.rec.Sync("team-b/b", e.want("team-b/b")); !errors.Is(err, ErrConflict) {
		t.Fatalf("want ErrConflict, got %v", err)
	}
	got := k.ipsetEntries()
	if !strings.Contains(got, "add KUBE-EXTERNAL-IP 10.96.0.10,tcp:8080\n") || strings.Contains(got, "KUBE-EXTERNAL-IP 10.96.0.10,tcp:80\n") {
		t.Errorf("ipset entries:\n%s", got)
	}
	e.remove("team-a/a")
	if !strings.Contains(k.IPVS.String(), "-A -t 10.96.0.10:8080") || len(k.Dummy.Addresses()) != 2 {
		t.Errorf("the loser's own port must keep its address: %v\n%s", k.Dummy.Addresses(), k.IPVS.String())
	}
}

// The loser is told once, in a Warning Event that names the virtual
// server but not the other tenant's Service.
func TestConflictGivesOneWarning(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	tracker := NewTracker()
	events := &recordedEvents{}
	fc := clocktesting.NewFakeClock(time.Now()) // the retries come when the test steps it
	runner := NewRunner(RunnerConfig{Build: testConfig, Events: events, RetryBase: time.Millisecond, RetryMax: time.Millisecond,
		Clock: fc}, tracker, e.rec)
	runner.informersSynced.Store(true)
	tracker.ServiceHandler().OnAdd(svc("team-a", "a", "10.96.0.10", "80"), true)
	ctx := context.Background()
	runner.next(ctx)
	b := svc("team-b", "b", "10.96.0.20", "80")
	b.Spec.ExternalIPs = []string{"10.96.0.10"}
	tracker.ServiceHandler().OnAdd(b, true)
	for i := 0; i < 3; i++ { // the first attempt and two retries
		fc.Step(time.Millisecond)
		runner.next(ctx)
	}
	want := "b IPVSProxyConflict: virtual server tcp 10.96.0.10:80 is already programmed for another Service; nothing is written for it until that Service releases it"
	if ev := events.list(); len(ev) != 1 || ev[0] != want {
		t.Fatalf("events %q, want one: %s", ev, want)
	}
}

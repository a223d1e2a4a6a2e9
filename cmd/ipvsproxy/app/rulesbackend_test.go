package app

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/internal/enginetest"
	"github.com/ipvsproxy/ipvsproxy/internal/fakenode"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

func TestRulesBackendNFTablesAccepted(t *testing.T) {
	o, _, err := load(t, "--rules-backend", "nftables")
	if err != nil || o.RulesBackend != RulesBackendNFTables {
		t.Errorf("--rules-backend nftables: %v, %q", err, o.RulesBackend)
	}
}

// tableNode is a node wired as the proxy wires it with
// --rules-backend=nftables, over fake kernels: the engine writes the
// service's set elements into the table, never into the ipsets.
func tableNode(t *testing.T, retire func() error) (*fakenode.Node, *nftrules.Fake, *nodeSetup, *sync.Reconciler) {
	n, table, setup, rec, _ := tableNodeMetrics(t, retire)
	return n, table, setup, rec
}

// tableNodeMetrics is tableNode with the registry its metrics are on.
func tableNodeMetrics(t *testing.T, retire func() error) (*fakenode.Node, *nftrules.Fake, *nodeSetup, *sync.Reconciler, *prometheus.Registry) {
	t.Helper()
	n := fakenode.New(t, true, false)
	table, err := nftrules.NewFake(nftrules.DefaultConfig(true, false))
	if err != nil {
		t.Fatal(err)
	}
	kernel := n.Kernel()
	reg := prometheus.NewRegistry()
	metrics := sync.NewMetrics(reg)
	setup := tableNodeSetup(kernel, table, false, metrics, retire)
	kernel.IPSet = setup.ipset
	rec := newReconciler(NewOptions(), kernel, setup, metrics, "node-a")
	return n, table, setup, rec, reg
}

func webService() map[string]*sync.ServiceState {
	cfg := sync.Config{NodeName: "node-a", Scheduler: "rr", IPv4: true}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}
	b := sync.Build(svc, nil, &cfg)
	return map[string]*sync.ServiceState{"default/web": &b.State}
}

// The node set-up writes the table (no ipset, no iptables); the engine's
// elements land in it; every later full pass syncs the table's
// structure (a read: it is unchanged) and leaves its elements as they
// are; a failed Sync fails the set-up and is counted in
// kubeproxy_sync_proxy_rules_nftables_sync_failures_total.
func TestTableSetupEnsureKeepsElements(t *testing.T) {
	n, table, setup, rec, reg := tableNodeMetrics(t, func() error { return nil })
	if err := setup.ensure(); err != nil {
		t.Fatal(err)
	}
	if _, err := enginetest.FullSync(rec, webService()); err != nil {
		t.Fatal(err)
	}
	listing := table.String()
	if !strings.Contains(listing, "10.96.0.10 . tcp . 80") {
		t.Fatalf("the service's element is not in the table:\n%s", listing)
	}
	if c := n.IPSet.Counts(); sumCounts(c) > 0 {
		t.Errorf("the ipsets were used: %v", c)
	}
	table.ResetCounts()
	for range 3 {
		if err := setup.ensure(); err != nil {
			t.Fatal(err)
		}
	}
	if got := table.Counts(); got[nftrules.VerbSync] != 3 || got[nftrules.VerbAddElements]+got[nftrules.VerbDeleteElements] != 0 {
		t.Errorf("ensure made %v, want 3 Syncs and no element writes", got)
	}
	if table.String() != listing {
		t.Errorf("ensure changed the table:\n%s\nwas:\n%s", table, listing)
	}
	// A refused table write fails the node set-up (the pass retries).
	const failures = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	if got := counterValue(t, reg, failures, sync.FamilyIPv4); got != 0 {
		t.Errorf("%s = %v before any failure", failures, got)
	}
	table.FailOn(nftrules.VerbSync, nil, errors.New("netlink: EPERM"))
	if err := setup.ensure(); err == nil {
		t.Error("a refused Sync was not reported")
	}
	if got := counterValue(t, reg, failures, sync.FamilyIPv4); got != 1 {
		t.Errorf("%s{ip_family=IPv4} = %v after a failed Sync, want 1", failures, got)
	}
}

// Between passes the table monitor restores a deleted table once the
// generation moved, and counts it in
// ipvsproxy_nftables_table_restores_total.
func TestTableMonitorRestoresAndCounts(t *testing.T) {
	_, table, setup, _, reg := tableNodeMetrics(t, func() error { return nil })
	if err := setup.ensure(); err != nil {
		t.Fatal(err)
	}
	want := table.String()
	var gen atomic.Uint32
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	startTableMonitor(ctx, reg, setup.table, func() (uint32, error) { return gen.Load(), nil }, setup.onTableFail)
	if err := table.DeleteTable(); err != nil {
		t.Fatal(err)
	}
	gen.Add(1)
	const restores = "ipvsproxy_nftables_table_restores_total"
	deadline := time.Now().Add(20 * time.Second)
	for counterValue(t, reg, restores, "") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s not counted within 20 s; table:\n%s", restores, table)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if table.String() != want {
		t.Errorf("restored table:\n%s\nwant:\n%s", table, want)
	}
}

// A failed removal of the table (the iptables backend retiring it) is
// counted in kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total
// under each family; a success is not.
func TestTableCleanupFailuresCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics := sync.NewMetrics(reg)
	fail := errors.New("netlink: EPERM")
	var result error
	do := countingFailures(func() error { return result }, func() { metrics.NFTablesFailed(metrics.NFTablesCleanupFailures, true) })
	const name = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
	if err := do(); err != nil || counterValue(t, reg, name, sync.FamilyIPv4) != 0 {
		t.Fatalf("a successful cleanup: %v, counted %v", err, counterValue(t, reg, name, sync.FamilyIPv4))
	}
	result = fail
	if err := do(); !errors.Is(err, fail) {
		t.Fatalf("the failure was not returned: %v", err)
	}
	for _, f := range []string{sync.FamilyIPv4, sync.FamilyIPv6} {
		if got := counterValue(t, reg, name, f); got != 1 {
			t.Errorf("%s{ip_family=%s} = %v, want 1", name, f, got)
		}
	}
}

// counterValue is the value of the counter family name with ip_family
// family on reg ("": the series without labels; 0 when there is none).
func counterValue(t *testing.T, reg prometheus.Gatherer, name, family string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if family == "" && len(m.GetLabel()) == 0 {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "ip_family" && l.GetValue() == family {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func sumCounts(c map[string]int) int {
	n := 0
	for v := range maps.Values(c) {
		n += v
	}
	return n
}

// The other backend is removed after a full pass, retried after each
// later pass until it succeeds, and then never again; the sizing advice
// runs after every pass.
func TestOtherBackendRemovedAfterFullPass(t *testing.T) {
	var tries, sized int
	fail := true
	retire := &afterFirstPass{what: "test", do: func() error {
		tries++
		if fail {
			return errors.New("xtables lock")
		}
		return nil
	}}
	hook := afterFullSync(func(int, int) { sized++ }, retire)
	hook(1, 1)
	hook(1, 1)
	fail = false
	hook(1, 1)
	hook(1, 1)
	if tries != 3 || sized != 4 {
		t.Errorf("%d removals tried, sizing %d times; want 3 and 4", tries, sized)
	}
	afterFullSync(func(int, int) {}, nil)(0, 0) // no other backend: nothing to do
}

// The nftables node set-up retires the iptables backend through the
// full-pass hook it was given.
func TestTableSetupRetiresIPTables(t *testing.T) {
	called := false
	_, _, setup, _ := tableNode(t, func() error { called = true; return nil })
	if setup.table == nil || setup.retire == nil {
		t.Fatal("no table or no retirement in the nftables set-up")
	}
	afterFullSync(func(int, int) {}, setup.retire)(0, 0)
	if !called {
		t.Error("the iptables backend was not removed after the first full pass")
	}
}

// A node without ip_set: nothing of the iptables backend to remove, and
// cleanup's read of the sets finds none.
func TestNoIPSets(t *testing.T) {
	var s noIPSets
	if sets, err := s.ListSets(); err != nil || len(sets) != 0 {
		t.Errorf("ListSets: %v, %v", sets, err)
	}
	if _, err := s.ListEntries("KUBE-CLUSTER-IP"); !errors.Is(err, ipset.ErrSetNotFound) {
		t.Errorf("ListEntries: %v", err)
	}
	if err := s.EnsureSet(ipset.Set{Name: "KUBE-CLUSTER-IP"}); err == nil {
		t.Error("EnsureSet succeeded on a kernel without ip_set")
	}
}

package sync

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvsproxy/ipvsproxy/internal/fakenode"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"maps"
	"slices"
)

const testNode = "node-a"

var testConfig = Config{NodeName: testNode, Scheduler: "rr", IPv4: true, IPv6: true}

// svc builds a ClusterIP Service; ports are "name:port/PROTO" or "port".
func svc(ns, name, clusterIP string, ports ...string) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}},
	}
	for _, p := range ports {
		var sp v1.ServicePort
		sp.Protocol = v1.ProtocolTCP
		if i := strings.IndexByte(p, '/'); i >= 0 {
			sp.Protocol = v1.Protocol(p[i+1:])
			p = p[:i]
		}
		if i := strings.IndexByte(p, ':'); i >= 0 {
			sp.Name = p[:i]
			p = p[i+1:]
		}
		fmt.Sscan(p, &sp.Port)
		s.Spec.Ports = append(s.Spec.Ports, sp)
	}
	return s
}

// ep is one endpoint of a slice.
type ep struct {
	ip          string
	node        string
	notReady    bool
	terminating bool
}

// slice builds an EndpointSlice for service name with one port.
func slice(ns, svcName, sliceName, portName string, port int32, proto v1.Protocol, eps ...ep) *discovery.EndpointSlice {
	fam := discovery.AddressTypeIPv4
	if len(eps) > 0 && strings.Contains(eps[0].ip, ":") {
		fam = discovery.AddressTypeIPv6
	}
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sliceName,
			Labels: map[string]string{discovery.LabelServiceName: svcName}},
		AddressType: fam,
		Ports:       []discovery.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(proto)}},
	}
	for _, e := range eps {
		d := discovery.Endpoint{Addresses: []string{e.ip}, Conditions: discovery.EndpointConditions{
			Ready: ptr.To(!e.notReady), Serving: ptr.To(!e.notReady || e.terminating), Terminating: ptr.To(e.terminating)}}
		if e.node != "" {
			d.NodeName = ptr.To(e.node)
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	return s
}

// proxySlices is what the tracker keeps of sl.
func proxySlices(sl ...*discovery.EndpointSlice) []*ProxySlice {
	var out []*ProxySlice
	for _, s := range sl {
		if s == nil {
			out = append(out, nil)
			continue
		}
		out = append(out, NewProxySlice(s))
	}
	return out
}

// kernel is a fake node: IPVS, kube-ipvs0 and ipsets in memory, with
// the engine tests' views of it.
type kernel struct{ *fakenode.Node }

func newKernel(t testing.TB) *kernel { return &kernel{fakenode.New(t, true, true)} }

// writes counts the kernel writes since the last reset, by verb.
func (k *kernel) writes() map[string]int {
	out := map[string]int{}
	for _, c := range []map[string]int{k.IPVS.Counts(), k.Dummy.Counts(), k.IPSet.Counts()} {
		for verb, n := range c {
			if isWrite(verb) && n > 0 {
				out[verb] += n
			}
		}
	}
	return out
}

// reads counts the list/dump calls since the last reset.
func (k *kernel) reads() int {
	n := 0
	for _, c := range []map[string]int{k.IPVS.Counts(), k.Dummy.Counts(), k.IPSet.Counts()} {
		for verb, v := range c {
			if lv := strings.ToLower(verb); strings.HasPrefix(lv, "list") || strings.HasPrefix(lv, "walk") || verb == "GetTimeouts" {
				n += v
			}
		}
	}
	return n
}

func isWrite(verb string) bool {
	v := strings.ToLower(verb)
	return strings.HasPrefix(v, "add") || strings.HasPrefix(v, "del") || strings.HasPrefix(v, "update")
}

// ipsetEntries prints the add lines of the owned sets, like `ipset save | grep ^add`.
func (k *kernel) ipsetEntries() string {
	var b strings.Builder
	for _, line := range strings.Split(k.IPSet.String(), "\n") {
		if strings.HasPrefix(line, "add ") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// engine is a Reconciler on a fake kernel plus the objects it is fed.
type engine struct {
	t        testing.TB
	k        *kernel
	rec      *Reconciler
	cfg      Config // what the builder knows about the node
	services map[string]*v1.Service
	slices   map[string][]*discovery.EndpointSlice
}

func newEngine(t testing.TB, k *kernel, exclude ...netip.Prefix) *engine {
	var sets []string
	for _, s := range owned.Sets(true, true) {
		sets = append(sets, s.Name)
	}
	return &engine{t: t, k: k, rec: NewReconciler(k.Kernel(), sets, exclude), cfg: testConfig,
		services: map[string]*v1.Service{}, slices: map[string][]*discovery.EndpointSlice{}}
}

func (e *engine) want(key string) *ServiceState {
	st := Build(e.services[key], proxySlices(e.slices[key]...), &e.cfg).State
	return &st
}

// apply records the objects and syncs their service incrementally.
func (e *engine) apply(s *v1.Service, sl ...*discovery.EndpointSlice) {
	e.t.Helper()
	key := s.Namespace + "/" + s.Name
	e.services[key] = s
	e.slices[key] = sl
	if err := e.syncKey(key); err != nil {
		e.t.Fatalf("sync %s: %v", key, err)
	}
}

// syncKey adopts key from the start-up read, when one is in use, and
// syncs it: what the runner does with a changed service.
func (e *engine) syncKey(key string) error {
	want := e.want(key)
	if err := e.rec.Adopt(key, want); err != nil {
		return err
	}
	return e.rec.Sync(key, want)
}

func (e *engine) remove(key string) {
	e.t.Helper()
	delete(e.services, key)
	delete(e.slices, key)
	if err := e.syncKey(key); err != nil {
		e.t.Fatalf("sync %s: %v", key, err)
	}
}

func (e *engine) full() FullSyncResult {
	e.t.Helper()
	want := map[string]*ServiceState{}
	for k := range e.services {
		want[k] = e.want(k)
	}
	res, err := fullSync(e.rec, want)
	if err != nil {
		e.t.Fatalf("full sync: %v", err)
	}
	if len(res.Failed) > 0 || res.Prune != nil {
		e.t.Fatalf("full sync failures: %v prune: %v", res.Failed, res.Prune)
	}
	checkCounts(e.t, e.rec)
	return res
}

func assertText(t testing.TB, what, got, want string) {
	t.Helper()
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Errorf("%s:\n--- got ---\n%s\n--- want ---\n%s", what, got, want)
	}
}

// fullSync runs a whole pass at once over want, which must hold every
// service the proxy knows (internal/enginetest.FullSync, which imports
// this package, for the tests inside it).
func fullSync(rec *Reconciler, want map[string]*ServiceState) (FullSyncResult, error) {
	return fullSyncOf(rec, want, NewPassKeys(slices.Collect(maps.Keys(want))))
}

// fullSyncOf is fullSync over keys (want's, made by the caller).
func fullSyncOf(rec *Reconciler, want map[string]*ServiceState, keys PassKeys) (FullSyncResult, error) {
	if err := rec.BeginPass(keys, rec.ReadForPass()); err != nil {
		return FullSyncResult{}, err
	}
	for {
		step := rec.StepPass(func(k string) *ServiceState { return want[k] }, func() bool { return false })
		if step.Done {
			return rec.FinishPass(), nil
		}
	}
}

// passInProgress reports whether a full pass is under way: its node
// set-up and read beside the loop, or its steps.
func (r *Runner) passInProgress() bool { return r.settingUp || r.rec.PassRunning() }

// servicesLeftInPass is how many services the running pass has not yet
// stepped (its prune comes after them).
func (r *Reconciler) servicesLeftInPass() int { return len(r.pass.keys.keys.sorted) - r.pass.keys.pos }

// checkCounts fails t when the records' kept server counts differ from a
// walk of the records.
func checkCounts(t testing.TB, rec *Reconciler) {
	t.Helper()
	var walked serverCount
	for _, st := range rec.rec.applied {
		walked.add(st, 1)
	}
	if vs, reals := rec.Counts(); vs != walked.vs || reals != walked.reals {
		t.Errorf("Counts() = %d virtual, %d real servers; the records hold %d, %d", vs, reals, walked.vs, walked.reals)
	}
}

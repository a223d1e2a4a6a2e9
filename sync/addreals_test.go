package sync

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"

	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// opCounter counts what the Reconciler observes (OnOp, which feeds the
// metrics): by "object verb", failures apart.
type opCounter struct{ ok, failed map[string]int }

func countOps(r *Reconciler) *opCounter {
	c := &opCounter{ok: map[string]int{}, failed: map[string]int{}}
	r.OnOp = func(op Op, err error) {
		if err != nil {
			c.failed[op.Object+" "+op.Verb]++
			return
		}
		c.ok[op.Object+" "+op.Verb]++
	}
	return c
}

// A new virtual server with k endpoints: one virtual-server add and one
// batched add of its k real servers, each still observed as one op (the
// metrics count real servers written, not round trips).
func TestNewVirtualServerAddsItsRealServersInOneBatch(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	ops := countOps(e.rec)
	k.ResetCounts()
	e.apply(manyService(1, 10))
	want := map[string]int{"AddVirtualServer": 1, ipvs.VerbAddRealServers: 1}
	if got := k.IPVS.Counts(); !maps.Equal(got, want) {
		t.Errorf("IPVS calls %v, want %v", got, want)
	}
	if ops.ok["real_server add"] != 10 || len(ops.failed) != 0 {
		t.Errorf("observed %v, failed %v; want 10 real_server adds", ops.ok, ops.failed)
	}
	if n := strings.Count(k.IPVS.String(), "-a -t 10.96.0.1:80"); n != 10 {
		t.Errorf("%d real servers in the kernel, want 10:\n%s", n, k.IPVS.String())
	}
}

// Each real server of a batch is settled as a lone add was: one the
// kernel refused is left out of the record (and retried alone next
// time), one already there gets its weight back by an update and is
// recorded, the others are recorded.
func TestBatchedRealServerErrorsSettledOneByOne(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	s, sl := manyService(1, 5)
	key := "ns/" + s.Name
	vs := ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.1"), Protocol: ipvs.TCP, Port: 80}
	refused := ipvs.RealKey{Address: netip.MustParseAddr("10.130.0.1"), Port: 8080}
	stale := ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("10.131.0.1"), Port: 8080}, Weight: 0}
	must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: vs, Scheduler: "rr"})) // left by someone
	must(t, k.IPVS.AddRealServer(vs, stale))
	boom := errors.New("injected: ENOMEM")
	undo := k.IPVS.FailOn("AddRealServer", func(c ipvs.Call) bool { return c.Real == refused }, boom)
	ops := countOps(e.rec)
	k.ResetCounts()

	e.services[key], e.slices[key] = s, []*discovery.EndpointSlice{sl}
	if err := e.rec.Sync(key, e.want(key)); !errors.Is(err, boom) {
		t.Fatalf("sync: %v, want the refusal", err)
	}
	var recorded []string
	for _, rs := range e.rec.Applied(key).VirtualServers[0].Reals {
		recorded = append(recorded, fmt.Sprint(rs.RealKey, "/", rs.Weight))
	}
	if want := "[10.128.0.1:8080/1 10.129.0.1:8080/1 10.131.0.1:8080/1 10.132.0.1:8080/1]"; fmt.Sprint(recorded) != want {
		t.Errorf("recorded %v, want %s: all but the refused one, the stale one at its weight", recorded, want)
	}
	if !strings.Contains(k.IPVS.String(), "-r 10.131.0.1:8080 -m -w 1") {
		t.Errorf("the stale real server's weight was not restored:\n%s", k.IPVS.String())
	}
	wantOK := map[string]int{"virtual_server update": 1, "real_server add": 3, "real_server update": 1, "address add": 1, "set_entry add": 2}
	if !maps.Equal(ops.ok, wantOK) || !maps.Equal(ops.failed, map[string]int{"real_server add": 1}) {
		t.Errorf("observed %v, failed %v; want %v and one failed add", ops.ok, ops.failed, wantOK)
	}

	// The retry sends the refused one alone, in one batch.
	undo()
	var batched []ipvs.RealKey
	k.IPVS.Record(func(verb string, c ipvs.Call) {
		if c.Batched {
			batched = append(batched, c.Real)
		}
	})
	k.ResetCounts()
	if err := e.rec.Sync(key, e.want(key)); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := fmt.Sprint(k.writes()); got != "map[AddRealServers:1]" || len(batched) != 1 || batched[0] != refused {
		t.Errorf("retry wrote %s carrying %v; want one batch of the refused real server", got, batched)
	}
}

package sync

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// setMessages counts the ipset add messages on k since its last reset:
// each AddEntry is one, each AddEntries call one per message.
func setMessages(k *kernel) int {
	return k.IPSet.Count(ipset.VerbAddEntry) + k.IPSet.Count(ipset.VerbAddEntries)
}

// A cold start of 10,000 services (a full pass over an empty kernel, as a
// new node's first pass) writes its set entries many per message: at
// most one message per message's worth of entries, plus one per set for
// the last, partly filled one. One message per entry before. The kernel
// ends as programming each service on its own leaves it, and the record
// agrees: a second pass writes nothing.
func TestColdStartWritesSetEntriesInBatches(t *testing.T) {
	c := newBenchCluster(guardServices)
	k := newBenchKernel(t, guardServices)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	// A clock that never moves: no flush for time, so the count does not
	// depend on the machine's speed.
	rec.write.pending.clock = clocktesting.NewFakeClock(time.Now())
	k.ResetCounts()
	if res, err := fullSync(rec, c.want()); err != nil || len(res.Failed) > 0 || res.Prune != nil {
		t.Fatalf("cold start: %v %v %v", err, res.Failed, res.Prune)
	}
	entries, sets, perMessage := 0, 0, 1<<30
	for _, set := range ownedSetNames() {
		listed, _ := k.IPSet.ListEntries(set)
		if len(listed) == 0 {
			continue
		}
		entries += len(listed)
		sets++
		for _, e := range listed {
			perMessage = min(perMessage, ipset.MessageRoom(set)/ipset.EntrySize(e))
		}
	}
	got, bound := setMessages(k), (entries+perMessage-1)/perMessage+sets
	t.Logf("%d services: %d set entries in %d sets, %d add messages (one per entry before; bound %d, %d entries per message)",
		guardServices, entries, sets, got, bound, perMessage)
	if entries < 2*guardServices || got > bound || k.IPSet.Count(ipset.VerbAddEntries) == 0 {
		t.Errorf("%d add messages for %d entries in %d sets, want at most %d", got, entries, sets, bound)
	}

	// The same services synced one by one, without deferring.
	one := newBenchKernel(t, guardServices)
	single := NewReconciler(one.Kernel(), ownedSetNames(), nil)
	want := c.want()
	for _, key := range c.keys {
		must(t, single.Sync(key, want[key]))
	}
	if k.ipsetEntries() != one.ipsetEntries() || setMessages(one) != entries {
		t.Errorf("batched and one-by-one kernels differ (%d and %d bytes), or one-by-one took %d messages",
			len(k.ipsetEntries()), len(one.ipsetEntries()), setMessages(one))
	}
	k.ResetCounts()
	if res, err := fullSync(rec, want); err != nil || len(res.Failed) > 0 || len(k.writes()) > 0 {
		t.Errorf("second pass: %v %v, writes %v", err, res.Failed, k.writes())
	}
}

// entryState is a service state of set entries only.
func entryState(entries ...owned.SetEntry) *ServiceState {
	st := &ServiceState{Entries: slices.Clone(entries)}
	slices.SortFunc(st.Entries, owned.CompareSetEntries)
	return st
}

func clusterEntry(i int) owned.SetEntry {
	return owned.SetEntry{Set: owned.SetClusterIP, Entry: ipset.Entry{IP: netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}), Protocol: "tcp", Port: 80}}
}

func ipvsIPEntry(i int) owned.SetEntry {
	return owned.SetEntry{Set: owned.SetIPVSIPs, Entry: ipset.Entry{IP: netip.AddrFrom4([4]byte{10, 96, 1, byte(i)})}}
}

// While deferring, a sync's new entries are neither written nor recorded;
// FlushEntries writes them, KUBE-IPVS-IPS last, and records each for the
// keys that want it (an entry two keys want is one kernel entry held by
// both); an entry the kernel refuses fails only the keys that want it.
func TestDeferredEntriesFlush(t *testing.T) {
	k := newKernel(t)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	var order []string
	k.IPSet.Record(func(verb string, c ipset.Call) {
		if verb == ipset.VerbAddEntries || verb == ipset.VerbAddEntry && !c.Batched {
			order = append(order, c.Set)
		}
	})
	boom := errors.New("boom")
	undo := k.IPSet.FailOn(ipset.VerbAddEntry, func(c ipset.Call) bool { return c.Entry == clusterEntry(3).Entry }, boom)
	rec.DeferWrites(true)
	must(t, rec.Sync("ns/a", entryState(clusterEntry(1), ipvsIPEntry(1), clusterEntry(9))))
	must(t, rec.Sync("ns/b", entryState(clusterEntry(2), ipvsIPEntry(2), clusterEntry(9))))
	must(t, rec.Sync("ns/c", entryState(clusterEntry(3), ipvsIPEntry(3))))
	if setMessages(k) != 0 || len(k.IPSet.Entries(owned.SetClusterIP)) != 0 || rec.Applied("ns/a") != nil {
		t.Fatalf("written before the flush: %d messages, record %v", setMessages(k), rec.Applied("ns/a"))
	}
	failed := rec.FlushWrites()
	if len(failed) != 1 || !errors.Is(failed["ns/c"], boom) {
		t.Fatalf("failed keys %v", failed)
	}
	if fmt.Sprint(order) != "[KUBE-CLUSTER-IP KUBE-IPVS-IPS]" {
		t.Errorf("messages to %v, want KUBE-CLUSTER-IP then KUBE-IPVS-IPS", order)
	}
	for key, n := range map[string]int{"ns/a": 3, "ns/b": 3, "ns/c": 1} {
		if got := len(rec.Applied(key).Entries); got != n {
			t.Errorf("%s records %d entries, want %d", key, got, n)
		}
	}
	if got := k.IPSet.Entries(owned.SetClusterIP); len(got) != 3 {
		t.Errorf("KUBE-CLUSTER-IP holds %v", got)
	}
	// The shared entry goes with its last user; c's refused entry is
	// written by c's retry, alone, at once (not deferring).
	rec.DeferWrites(false)
	must(t, rec.Sync("ns/a", &ServiceState{}))
	if !slices.Contains(k.IPSet.Entries(owned.SetClusterIP), "10.96.1.9,tcp:80") {
		t.Error("an entry b still holds went with a")
	}
	must(t, rec.Sync("ns/b", &ServiceState{}))
	k.ResetCounts()
	clear(order)
	undo()
	must(t, rec.Sync("ns/c", entryState(clusterEntry(3), ipvsIPEntry(3))))
	if got := k.IPSet.Entries(owned.SetClusterIP); fmt.Sprint(got) != "[10.96.1.3,tcp:80]" || k.IPSet.Count(ipset.VerbAddEntry) != 1 {
		t.Errorf("after the retry: %v, %v", got, k.IPSet.Counts())
	}
}

// deferringWithFakeClock is a reconciler deferring set entries, whose
// deadline runs on the returned clock.
func deferringWithFakeClock(t *testing.T) (*kernel, *Reconciler, *clocktesting.FakeClock) {
	k := newKernel(t)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	clk := clocktesting.NewFakeClock(time.Now())
	rec.write.pending.clock = clk
	rec.DeferWrites(true)
	return k, rec, clk
}

// A deferred entry waits at most maxDeferral, and a key synced again
// has its waiting entries written first, so its record stays true.
func TestDeferredEntriesDueAndResync(t *testing.T) {
	k, rec, clk := deferringWithFakeClock(t)
	must(t, rec.Sync("ns/a", entryState(clusterEntry(1))))
	clk.Step(maxDeferral)
	must(t, rec.Sync("ns/b", entryState(clusterEntry(2))))
	if got := k.IPSet.Entries(owned.SetClusterIP); len(got) != 2 {
		t.Fatalf("after maxDeferral: %v", got)
	}
	must(t, rec.Sync("ns/a", entryState(clusterEntry(4))))
	must(t, rec.Sync("ns/a", entryState(clusterEntry(5))))
	if failed := rec.FlushWrites(); len(failed) != 0 {
		t.Fatal(failed)
	}
	want := "[10.96.1.2,tcp:80 10.96.1.5,tcp:80]"
	if got := k.IPSet.Entries(owned.SetClusterIP); fmt.Sprint(got) != want {
		t.Errorf("KUBE-CLUSTER-IP holds %v, want %s", got, want)
	}
	if got := rec.Applied("ns/a").Entries; len(got) != 1 || got[0] != clusterEntry(5) {
		t.Errorf("a records %v", got)
	}
	if got := slices.Collect(maps.Keys(rec.rec.entryRefs)); len(got) != 2 {
		t.Errorf("references held on %v", got)
	}
}

// A wait ends when its entries are written: its timer, firing later, does
// not make the next wait's entries due early, and the next wait has its
// own maxDeferral.
func TestDeferredEntriesEachWaitHasItsOwnDelay(t *testing.T) {
	k, rec, clk := deferringWithFakeClock(t)
	must(t, rec.Sync("ns/a", entryState(clusterEntry(1))))
	clk.Step(maxDeferral / 2)
	if failed := rec.FlushWrites(); len(failed) != 0 { // the batch's end
		t.Fatal(failed)
	}
	must(t, rec.Sync("ns/b", entryState(clusterEntry(2))))
	clk.Step(maxDeferral / 2) // the first wait's deadline: it had no timer left
	must(t, rec.Sync("ns/c", entryState(clusterEntry(3))))
	if got := k.IPSet.Entries(owned.SetClusterIP); fmt.Sprint(got) != "[10.96.1.1,tcp:80]" {
		t.Fatalf("half way through the second wait, KUBE-CLUSTER-IP holds %v", got)
	}
	if !clk.HasWaiters() {
		t.Fatal("the second wait has no timer")
	}
	clk.Step(maxDeferral / 2)
	must(t, rec.Sync("ns/d", entryState(clusterEntry(4))))
	if got := k.IPSet.Entries(owned.SetClusterIP); len(got) != 4 {
		t.Fatalf("after the second wait's maxDeferral, KUBE-CLUSTER-IP holds %v", got)
	}
	if clk.HasWaiters() {
		t.Error("a timer is left with nothing waiting")
	}
}

// Through the runner: a set entry the kernel refuses when its batch is
// written fails only its service, which is retried with backoff until
// the entry is in; the other service of the batch is not touched again.
func TestRunnerRetriesRefusedSetEntry(t *testing.T) {
	h, fc := startRunnerFakeClock(t, time.Hour)
	web := ipset.Entry{IP: netip.MustParseAddr("10.96.0.10"), Protocol: "tcp", Port: 80}
	h.k.IPSet.FailTimes(2, ipset.VerbAddEntry, func(c ipset.Call) bool { return c.Entry == web }, errors.New("injected: ENOMEM"))
	h.create(t, svc("default", "web", "10.96.0.10", "http:80"))
	h.create(t, svc("default", "api", "10.96.0.11", "http:80"))
	eventually(t, "both ClusterIP entries, the refused one retried", func() bool {
		fc.Step(10 * time.Millisecond) // the backoff
		got := h.k.IPSet.Entries(owned.SetClusterIP)
		return slices.Contains(got, "10.96.0.10,tcp:80") && slices.Contains(got, "10.96.0.11,tcp:80")
	})
	if got := h.runner.rec.Applied("default/web").Entries; !slices.Contains(got, owned.SetEntry{Set: owned.SetClusterIP, Entry: web}) {
		t.Errorf("web's record lacks its entry: %v", got)
	}
	if n := h.k.IPSet.Count(ipset.VerbAddEntry) + h.k.IPSet.Count(ipset.VerbAddEntries); n > 2+3+2 {
		// IPVS-IPS and CLUSTER-IP for each service; web's CLUSTER-IP entry 3 times
		t.Errorf("%d add messages", n)
	}
}

package sync

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Deferred writes. A cold start, or a full pass that finds the kernel
// empty, creates for every service an address, a virtual server or more
// with their real servers, and set entries: at 100,000 services more
// than a million netlink messages, and one round trip each (kube-proxy's
// `ipset` process per entry is the same cost again, times a process).
// While the caller defers them (DeferWrites: the runner for each of its
// batches, a full pass for each step), the writer holds a sync's new
// objects back and writes them later, many per round trip:
//   - addresses to bind (dummyif.AddAddresses), and new virtual servers
//     with their real servers and new real servers of existing virtual
//     servers (ipvs.AddServices), once they fill a few sends
//     (dueMessages); set entries many per message (ipset.AddEntries) once
//     a set's fill a message;
//   - all of them when the oldest has waited maxDeferral, so at start-up,
//     when one batch runs for minutes, a write is never minutes late;
//   - all of them at the end of the batch or step (FlushWrites), and
//     before anything else touches a key that has some waiting (its next
//     sync, its adoption, a kernel read, the prune).
//
// Only objects no record holds yet wait: an address bound for no key, a
// virtual server new to its key, a real server new to its virtual server
// (at start-up the services arrive before their EndpointSlices, so most
// real servers are added to virtual servers created a batch earlier), a
// set entry no key references. Deletes,
// updates and the references a sync takes on objects already written are
// immediate, as is everything outside a deferring scope (a direct Sync).
// An object is recorded for the keys that wanted it only once the kernel
// accepted it, as every other write; a refused one fails those keys,
// which are retried like any failed sync. Addresses go first, then
// virtual servers, then set entries, KUBE-IPVS-IPS last: an address in
// it that is not yet in the sets that accept its traffic would have new
// connections rejected (KUBE-IPVS-FILTER).

// maxDeferral bounds how long a deferred write waits. A quarter second
// of writes is 50 services or more on the slowest kernel measured
// (user-mode Linux, ≈ 5 ms per service), enough for most of the gain.
const maxDeferral = 250 * time.Millisecond

// DeferWrites makes the syncs that follow defer the new objects they
// write, until FlushWrites (deferred.go). Turning it off flushes.
func (r *Reconciler) DeferWrites(on bool) {
	if !on {
		r.write.flush()
	}
	r.write.deferring = on
}

// FlushWrites makes the deferred writes and returns the keys whose
// writes the kernel refused, since the last FlushWrites (writes made
// when due, in the middle of a batch, included).
func (r *Reconciler) FlushWrites() map[string]error {
	r.write.flush()
	failed := r.write.deferredFailed
	r.write.deferredFailed = nil
	return failed
}

// FlushWritesOf makes the deferred writes, and returns why key's were
// refused (the other keys' failures stay for FlushWrites).
func (r *Reconciler) FlushWritesOf(key string) error {
	r.write.flush()
	err := r.write.deferredFailed[key]
	delete(r.write.deferredFailed, key)
	return err
}

// settle makes the deferred writes when key has some, before key's
// record is read or replaced.
func (w *writer) settle(key string) {
	if w.pending.waiting(key) {
		w.flush()
	}
}

// flush makes every deferred write.
func (w *writer) flush() { w.flushDue(w.pending.all()) }

// flushDue makes the writes d names, addresses first, then virtual
// servers, then set entries, set by set.
func (w *writer) flushDue(d dueWrites) {
	if d.binds {
		w.flushBinds(d.all)
	}
	if d.servers {
		w.flushServers(d.all)
	}
	w.flushSets(d.sets)
}

// failDeferred fails key for a deferred write the kernel refused.
func (w *writer) failDeferred(key string, err error) {
	if w.deferredFailed == nil {
		w.deferredFailed = map[string]error{}
	}
	w.deferredFailed[key] = errors.Join(w.deferredFailed[key], err)
}

// recordWritten adds to key's record what deferred writes put in the
// kernel for it (add changes the copy it is given; its slices are the
// record's: withAdded makes new ones).
func (w *writer) recordWritten(key string, add func(got *ServiceState)) {
	old := w.rec.of(key)
	got := *old
	add(&got)
	w.rec.store(key, old, &got)
}

// withAdded returns a new sorted slice of have (sorted) and added.
func withAdded[T any](have, added []T, cmp func(a, b T) int) []T {
	out := append(slices.Clone(have), added...)
	slices.SortFunc(out, cmp)
	return out
}

// dueMessages is how many messages of addresses, or of virtual servers
// with their real servers, make a flush due: four sends' worth. Such a
// flush takes whole sends' worth (takeBinds, takeServers), so only the
// flush of everything at the end sends a partly filled one.
const dueMessages = 4 * nlconn.MaxPipelined

// pendingWrites are the deferred writes. due runs after every service's
// sync, so whether the oldest has waited maxDeferral is a deadline's
// flag, not a clock read (deadline.go).
type pendingWrites struct {
	// Set entries, per set in the order wanted.
	sets map[string]*pendingSet
	keys map[owned.SetEntry][]string // the keys that want each entry
	full []string                    // sets with a message's worth

	// Addresses to bind, in the order wanted.
	binds    []netip.Addr
	bindKeys map[netip.Addr][]string // the keys that want each address

	// Virtual servers to create, with their real servers.
	servers    []pendingServer
	serverMsgs int // their messages: one per virtual and per real server

	byKey map[string]int // writes waiting per key

	clock clock.WithDelayedExecution
	// overdue: the oldest write has waited maxDeferral. Each wait (from a
	// write deferred into an empty queue until the queue is empty again)
	// has a deadline of its own: an earlier wait's timer, firing late,
	// marks only its own.
	overdue *deadline
}

type pendingSet struct {
	entries []ipset.Entry
	bytes   int // their room in a message
}

// pendingServer is a virtual server key wants created, with its real
// servers, or, when existing, the real servers key wants added to one of
// its virtual servers that is there already.
type pendingServer struct {
	key      string
	vs       VirtualServerState
	existing bool
	// hadNone: the existing virtual server had no real server before this
	// sync (a UDP one's stale flows are cleaned when these are written).
	hadNone bool
}

func newPendingWrites(clk clock.WithDelayedExecution) *pendingWrites {
	return &pendingWrites{sets: map[string]*pendingSet{}, keys: map[owned.SetEntry][]string{},
		bindKeys: map[netip.Addr][]string{}, byKey: map[string]int{}, clock: clk}
}

func (p *pendingWrites) empty() bool {
	return len(p.sets) == 0 && len(p.binds) == 0 && len(p.servers) == 0
}

// waiting reports whether key has writes waiting.
func (p *pendingWrites) waiting(key string) bool { return p.byKey[key] > 0 }

// deferring notes one more write waiting for key, starting the clock on
// the first one deferred into an empty queue.
func (p *pendingWrites) deferring(key string) {
	if p.empty() {
		p.beginWait()
	}
	p.byKey[key]++
}

// written notes one write done for each of keys.
func (p *pendingWrites) written(keys ...string) {
	for _, k := range keys {
		if p.byKey[k]--; p.byKey[k] <= 0 {
			delete(p.byKey, k)
		}
	}
	if p.empty() {
		p.endWait()
	}
}

// wantedBy adds key to the keys that want x, and reports whether it was
// not among them yet (added) and whether x was waiting for another key
// already (then it is written once, for all of them).
func wantedBy[T comparable](wanting map[T][]string, x T, key string) (added, waiting bool) {
	keys, waiting := wanting[x]
	if slices.Contains(keys, key) {
		return false, true
	}
	wanting[x] = append(keys, key)
	return true, waiting
}

// addEntry defers e for key.
func (p *pendingWrites) addEntry(key string, e owned.SetEntry) {
	added, waiting := wantedBy(p.keys, e, key)
	if !added {
		return
	}
	p.deferring(key)
	if waiting {
		return
	}
	s := p.sets[e.Set]
	if s == nil {
		s = &pendingSet{}
		p.sets[e.Set] = s
	}
	s.entries = append(s.entries, e.Entry)
	s.bytes += ipset.EntrySize(e.Entry)
	if s.bytes+ipset.EntrySize(e.Entry) > ipset.MessageRoom(e.Set) && !slices.Contains(p.full, e.Set) {
		p.full = append(p.full, e.Set)
	}
}

// addBind defers binding a for key.
func (p *pendingWrites) addBind(key string, a netip.Addr) {
	added, waiting := wantedBy(p.bindKeys, a, key)
	if !added {
		return
	}
	p.deferring(key)
	if !waiting {
		p.binds = append(p.binds, a)
	}
}

// addServer defers creating v for key (which owns it already).
func (p *pendingWrites) addServer(key string, v VirtualServerState) {
	p.deferring(key)
	p.servers = append(p.servers, pendingServer{key: key, vs: v})
	p.serverMsgs += serverMessages(p.servers[len(p.servers)-1])
}

// addReals defers adding reals to vs, a virtual server of key's that is
// in the kernel and in key's record (hadNone: with no real server yet).
func (p *pendingWrites) addReals(key string, vs ipvs.VirtualServer, reals []ipvs.RealServer, hadNone bool) {
	p.deferring(key)
	p.servers = append(p.servers, pendingServer{key: key, vs: VirtualServerState{VS: vs, Reals: reals}, existing: true, hadNone: hadNone})
	p.serverMsgs += serverMessages(p.servers[len(p.servers)-1])
}

// beginWait starts the clock on the first write deferred into an empty
// queue.
func (p *pendingWrites) beginWait() { p.overdue = newDeadline(p.clock, maxDeferral) }

// endWait stops the clock once nothing waits.
func (p *pendingWrites) endWait() {
	if p.overdue != nil {
		p.overdue.stop()
		p.overdue = nil
	}
}

// takeSet removes set's entries, with the keys that want each.
func (p *pendingWrites) takeSet(set string) ([]ipset.Entry, map[ipset.Entry][]string) {
	s := p.sets[set]
	delete(p.sets, set)
	keys := make(map[ipset.Entry][]string, len(s.entries))
	for _, e := range s.entries {
		se := owned.SetEntry{Set: set, Entry: e}
		keys[e] = p.keys[se]
		delete(p.keys, se)
		p.written(keys[e]...)
	}
	p.full = slices.DeleteFunc(p.full, func(x string) bool { return x == set })
	return s.entries, keys
}

// takeBinds removes the addresses to bind, with the keys that want each:
// all of them, or only whole sends' worth (the rest wait on).
func (p *pendingWrites) takeBinds(all bool) ([]netip.Addr, map[netip.Addr][]string) {
	n := len(p.binds)
	if !all {
		n = max(1, n/nlconn.MaxPipelined*nlconn.MaxPipelined)
	}
	addrs := p.binds[:n:n]
	p.binds = slices.Clone(p.binds[n:])
	keys := make(map[netip.Addr][]string, len(addrs))
	for _, a := range addrs {
		keys[a] = p.bindKeys[a]
		delete(p.bindKeys, a)
		p.written(keys[a]...)
	}
	return addrs, keys
}

// takeServers removes the virtual servers to create: all of them, or
// only as many as fill whole sends with their messages (at least one;
// the rest wait on).
func (p *pendingWrites) takeServers(all bool) []pendingServer {
	n, msgs := len(p.servers), p.serverMsgs
	if !all {
		room := p.serverMsgs / nlconn.MaxPipelined * nlconn.MaxPipelined
		n, msgs = 0, 0
		for n < len(p.servers) && (n == 0 || msgs+serverMessages(p.servers[n]) <= room) {
			msgs += serverMessages(p.servers[n])
			n++
		}
	}
	servers := p.servers[:n:n]
	p.servers, p.serverMsgs = slices.Clone(p.servers[n:]), p.serverMsgs-msgs
	for _, s := range servers {
		p.written(s.key)
	}
	return servers
}

// serverMessages is how many messages writing s takes: one per real
// server, and one for the virtual server unless it exists.
func serverMessages(s pendingServer) int {
	if s.existing {
		return len(s.vs.Reals)
	}
	return 1 + len(s.vs.Reals)
}

// dueWrites are the deferred writes to make now.
type dueWrites struct {
	binds, servers bool
	// all: every address and virtual server waiting, not only whole sends'
	// worth.
	all  bool
	sets []string // in the order to write them
}

// due returns the writes to make now: each kind that fills a send (for
// sets, a message), or all of them when the oldest has waited
// maxDeferral or KUBE-IPVS-IPS is full (it goes last, see above).
func (p *pendingWrites) due() dueWrites {
	if p.empty() {
		return dueWrites{}
	}
	if p.overdue != nil && p.overdue.passed() || slices.ContainsFunc(p.full, isIPVSIPs) {
		return p.all()
	}
	return dueWrites{binds: len(p.binds) >= dueMessages, servers: p.serverMsgs >= dueMessages,
		sets: slices.Clone(p.full)}
}

// all returns every deferred write as due.
func (p *pendingWrites) all() dueWrites {
	return dueWrites{binds: len(p.binds) > 0, servers: len(p.servers) > 0, all: true, sets: p.setNames()}
}

// setNames returns the sets with entries waiting, KUBE-IPVS-IPS last.
func (p *pendingWrites) setNames() []string {
	names := make([]string, 0, len(p.sets))
	for set := range p.sets {
		names = append(names, set)
	}
	slices.SortFunc(names, func(a, b string) int {
		if x, y := isIPVSIPs(a), isIPVSIPs(b); x != y {
			if x {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	return names
}

package sync

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// A store tells a snapshot in use what it wrote, and only that: one
// that wrote no real server of a virtual server (its service's address
// or set entry changed) leaves the snapshot's real servers as read,
// someone else's included, without making a new list; one that added
// real servers merges them into what was read; a virtual server that had
// none takes the record's list as it is.
func TestStoreTellsTheSnapshotOnlyItsRealServers(t *testing.T) {
	rs := func(addrs ...string) []ipvs.RealServer {
		var out []ipvs.RealServer
		for _, a := range addrs {
			out = append(out, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr(a), Port: 8080}, Weight: 1})
		}
		return out
	}
	web := vsState("10.96.0.1", "rr", "10.244.0.1", "10.244.0.2")
	empty := vsState("10.96.0.2", "rr")
	rec := newRecord()
	snap := newKernelSnapshot(snapshotSize{})
	for _, st := range []*ServiceState{web, empty} {
		k := st.VirtualServers[0].VS.ServiceKey
		rec.vsOwner[k] = "ns/x"
		snap.vs[k] = newKernelVS(st.VirtualServers[0].VS)
		snap.vs[k].loaded = true
	}
	webKey, emptyKey := web.VirtualServers[0].VS.ServiceKey, empty.VirtualServers[0].VS.ServiceKey
	read := append(rs("10.244.0.9"), web.VirtualServers[0].Reals...) // someone else's first
	slices.SortFunc(read, compareReal)
	snap.vs[webKey].reals = read

	moved := *web
	moved.Addresses = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.9.1")}
	if n := testing.AllocsPerRun(10, func() { snap.noteSynced(rec, web, &moved) }); n != 0 {
		t.Errorf("a store of an address made %v allocations", n)
	}
	if got := snap.vs[webKey].reals; !sameSlice(got, read) {
		t.Errorf("a store of an address changed the real servers read: %v, want %v", got, read)
	}

	grown := moved
	grown.VirtualServers = slices.Clone(moved.VirtualServers)
	grown.VirtualServers[0].Reals = append(slices.Clone(web.VirtualServers[0].Reals), rs("10.244.0.3")...)
	snap.noteSynced(rec, &moved, &grown)
	if got, want := snap.vs[webKey].reals, rs("10.244.0.1", "10.244.0.2", "10.244.0.3", "10.244.0.9"); !slices.Equal(got, want) {
		t.Errorf("after adding a real server: %v, want %v", got, want)
	}

	first := *empty
	first.VirtualServers = slices.Clone(empty.VirtualServers)
	first.VirtualServers[0].Reals = rs("10.244.1.1")
	snap.noteSynced(rec, empty, &first)
	if got := snap.vs[emptyKey].reals; !sameSlice(got, first.VirtualServers[0].Reals) {
		t.Errorf("a virtual server's first real servers: %v, want the record's list", got)
	}
}

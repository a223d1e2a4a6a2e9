package sync

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// The order real servers are added in, per node.
//
// IPVS keeps a virtual server's real servers in a list, each new one at
// its head (list_add_rcu in __ip_vs_update_dest), and rr, wrr and lc start
// their walk at the head: the first connection goes to the real server
// added last. kube-proxy adds them in the same order on every node, so on
// a thousand nodes every node's first connection, and every node's first
// connection again after all proxies restart, goes to the same backend
// (kubernetes#121591).
//
// Here each node adds a virtual server's real servers in an order of its
// own: sorted by a hash of (node name, virtual server, real server). The
// order is stable across restarts of one node (no state, no randomness),
// different from node to node, and independent of the order the endpoints
// arrive in or whether they came with the service or later. Adoption
// writes nothing, so a restart leaves the kernel's list as it is.
//
// Except for the hashing schedulers: sh, mh and dh map a client (or a
// destination) to a backend through a table filled by walking the list in
// its order. A client whose packets reach the service through different
// nodes (an external load balancer's ECMP, a rehash) lands on the same
// backend only when every node's list is in the same order — the point of
// Maglev (mh). For them every node adds in the real servers' own order
// (ipvs.CompareRealKeys), as before.

// sameOnEveryNode are the schedulers whose choice must not depend on the
// node: those that hash over the list.
var sameOnEveryNode = map[string]bool{"sh": true, "mh": true, "dh": true}

// realOrder sorts reals, in place, into the order node adds them to vs:
// the last one is the one rr, wrr and lc pick first.
func realOrder(node string, vs ipvs.VirtualServer, reals []ipvs.RealServer) {
	if len(reals) < 2 {
		return
	}
	if sameOnEveryNode[vs.Scheduler] {
		slices.SortFunc(reals, compareReal)
		return
	}
	seed := orderSeed(node, vs.ServiceKey)
	slices.SortFunc(reals, func(a, b ipvs.RealServer) int {
		if c := cmp.Compare(realRank(seed, a.RealKey), realRank(seed, b.RealKey)); c != 0 {
			return c
		}
		return ipvs.CompareRealKeys(a.RealKey, b.RealKey) // a 64-bit tie: still one order
	})
}

// AddOrder returns reals in the order a proxy on node adds them to vs:
// the kernel lists them the other way round (ipvsadm -Ln --nosort), and
// rr, wrr and lc start with the last one. The end-to-end test predicts the
// kernel's list with it.
func AddOrder(node string, vs ipvs.VirtualServer, reals []ipvs.RealKey) []ipvs.RealKey {
	rs := make([]ipvs.RealServer, len(reals))
	for i, k := range reals {
		rs[i].RealKey = k
	}
	realOrder(node, vs, rs)
	out := make([]ipvs.RealKey, len(rs))
	for i, r := range rs {
		out[i] = r.RealKey
	}
	return out
}

// orderSeed hashes what the order depends on besides the real server.
func orderSeed(node string, vs ipvs.ServiceKey) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	a := vs.Address.As16()
	var buf [16 + 1 + 2 + 1]byte // address, protocol, port, and a separator from the node name
	copy(buf[1:], a[:])
	buf[17] = byte(vs.Protocol)
	binary.BigEndian.PutUint16(buf[18:], vs.Port)
	h.Write(buf[:])
	return h.Sum64()
}

// realRank is a real server's place in the order of seed. FNV alone
// spreads names that differ in one character poorly in its high bits, so
// the result goes through SplitMix64's finalizer, which flips each output
// bit with probability one half for any input bit.
func realRank(seed uint64, rk ipvs.RealKey) uint64 {
	a := rk.Address.As16()
	x := seed
	x ^= binary.BigEndian.Uint64(a[:8])
	x = mix64(x)
	x ^= binary.BigEndian.Uint64(a[8:]) ^ uint64(rk.Port)<<48
	return mix64(x)
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// SetNodeName sets the node name that seeds the order real servers are
// added in (realOrder). It is the proxy's node name, so a restart with the
// same --hostname-override adds them in the same order.
func (r *Reconciler) SetNodeName(name string) { r.write.node = name }

//go:build sandbox

package nftrules

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// What one transaction costs on the kernel, against the size of the set
// it writes to: the incremental path writes a new service's elements in
// a transaction of their own, a start-up batch many per transaction.
// Each iteration adds `batch` elements to KUBE-CLUSTER-IP's nft set,
// which already holds `held`, then deletes them again, so the set's size
// stays `held`; ns/commit is per transaction, adds and deletes alike.
// Compare with ipset's BenchmarkSandboxSingleAdds/BatchedAdds.
func BenchmarkSandboxCommit(b *testing.B) {
	for _, held := range []int{0, 10000, 50000} {
		for _, batch := range []int{1, MaxBatch} {
			b.Run(fmt.Sprintf("held=%d/batch=%d", held, batch), func(b *testing.B) {
				benchCommit(b, held, batch)
			})
		}
	}
}

func benchCommit(b *testing.B, held, batch int) {
	opts, _ := sandboxNetns(b)
	kern, err := New(DefaultConfig(true, false), opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer kern.Close()
	if _, err := kern.Sync(); err != nil {
		b.Fatal(err)
	}
	set := owned.SetName(owned.SetClusterIP, false)
	if err := kern.AddElements(set, clusterIPEntries(0, held)...); err != nil {
		b.Fatal(err)
	}
	extra := clusterIPEntries(held, batch)
	b.ReportAllocs()
	for b.Loop() {
		if err := kern.AddElements(set, extra...); err != nil {
			b.Fatal(err)
		}
		if err := kern.DeleteElements(set, extra...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/commit")
}

// clusterIPEntries are n distinct TCP service addresses from the i-th on.
func clusterIPEntries(i, n int) []ipset.Entry {
	out := make([]ipset.Entry, n)
	for k := range out {
		v := i + k
		out[k] = ipset.Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(v >> 8), byte(v)}), Protocol: "tcp", Port: uint16(80 + v>>16)}
	}
	return out
}

//go:build sandbox

package ipset

import (
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// Large set dumps on the real kernel. The sets are filled by `ipset
// restore` (one process, a writer independent of the code under test),
// then walked and compared entry by entry. Dumps are read-only, so no
// traffic is sent: the iptables rules that match these sets are proven
// with traffic by the e2e suite.

const bigSet = 20_000

func TestSandboxWalkLargeSets(t *testing.T) {
	n := newNetlink(t)
	sets := []Set{
		{Name: "WALK-4", Type: HashIPPort, Family: Inet},
		{Name: "WALK-6", Type: HashIPPortNet, Family: Inet6, MaxElem: 1 << 20},
	}
	want := map[string]map[Entry]bool{}
	var restore strings.Builder
	for _, s := range sets {
		fmt.Fprintf(&restore, "create %s %s family %s maxelem %d\n", s.Name, s.Type, s.Family, max(s.MaxElem, 1<<20))
		want[s.Name] = make(map[Entry]bool, bigSet)
		for i := range bigSet {
			e := Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: []string{"tcp", "udp", "sctp"}[i%3], Port: uint16(1 + i%60000)}
			if s.Family == Inet6 {
				e.IP = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
				e.Net = netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 3: byte(i % 7)}), 48+i%3*16)
			}
			want[s.Name][e] = true
			fmt.Fprintf(&restore, "add %s %s\n", s.Name, e.Format(s.Type))
		}
	}
	start := time.Now()
	cmd := exec.Command("ipset", "restore")
	cmd.Stdin = strings.NewReader(restore.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ipset restore: %v\n%s", err, out)
	}
	t.Logf("%d sets of %d entries filled by ipset restore in %v", len(sets), bigSet, time.Since(start).Round(time.Millisecond))

	for _, s := range sets {
		// Every entry comes back exactly once, as added. The check
		// allocates nothing, so what the walk allocates is measured.
		seen := make(map[Entry]bool, bigSet)
		bad := 0
		start := time.Now()
		bytes, objects := measure(func() {
			err := n.WalkEntries(s.Name, func() { clear(seen) }, func(e Entry) error {
				if !want[s.Name][e] || seen[e] {
					bad++
				}
				seen[e] = true
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
		if bad != 0 || len(seen) != bigSet {
			t.Fatalf("%s: walked %d of %d entries, %d wrong or repeated", s.Name, len(seen), bigSet, bad)
		}
		// The memory bound: a collected slice costs bigSet × sizeof(Entry)
		// (2 MB). The walk allocates per request and per 32 KiB batch of
		// entries, never per entry: TotalAlloc (every byte allocated,
		// whatever the garbage collector does) stays under a tenth of the
		// slice, and the allocations under one per hundred entries.
		slice := uint64(bigSet) * uint64(unsafe.Sizeof(Entry{}))
		t.Logf("%s: walked %d entries in %v, %d bytes in %d allocations (a collected slice: %d bytes)",
			s.Name, bigSet, time.Since(start).Round(time.Millisecond), bytes, objects, slice)
		if bytes > slice/10 || objects > bigSet/100 {
			t.Errorf("%s: the walk allocated %d bytes in %d allocations; want < %d bytes and < %d allocations", s.Name, bytes, objects, slice/10, bigSet/100)
		}
	}

	// fn may write through the same Netlink while the walk holds the
	// dump socket: here it deletes every entry it is handed.
	deleted := 0
	err := n.WalkEntries("WALK-4", nil, func(e Entry) error {
		deleted++
		return n.DeleteEntry("WALK-4", e)
	})
	if err != nil || deleted != bigSet {
		t.Fatalf("walk deleting as it goes: %v after %d entries", err, deleted)
	}
	if left, err := n.ListEntries("WALK-4"); err != nil || len(left) != 0 {
		t.Errorf("after deleting every walked entry: %d left, %v", len(left), err)
	}
}

// measure runs f and returns the bytes and objects it allocated.
func measure(f func()) (bytes, objects uint64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, after.Mallocs - before.Mallocs
}

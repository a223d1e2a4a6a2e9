//go:build sandbox

package dummyif

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// A large address dump on the real kernel. The addresses are bound by
// `ip -batch` (one process, a writer independent of the code under
// test), then walked and compared. Dumps are read-only, so no traffic is
// sent: TestSandboxAddressesAreLocalOnDownLink proves with traffic that
// addresses bound this way answer.

const bigAddrs = 5_000

func TestSandboxWalkManyAddresses(t *testing.T) {
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	// Another dummy link with addresses of its own, which the walk must
	// not hand over and LocalAddresses must report.
	const other = "walktest0"
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", other).Run() })
	want := make(map[netip.Addr]bool, bigAddrs)
	var batch strings.Builder
	fmt.Fprintf(&batch, "link add %s type dummy\n", other)
	for i := range bigAddrs {
		a := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		if i%4 == 3 {
			a = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x96, 14: byte(i >> 8), 15: byte(i)})
		}
		want[a] = true
		fmt.Fprintf(&batch, "addr add %s/%d dev %s\n", a, a.BitLen(), DefaultLinkName)
	}
	otherAddrs := []netip.Addr{netip.MustParseAddr("10.97.0.1"), netip.MustParseAddr("fd00:97::1")}
	for _, a := range otherAddrs {
		fmt.Fprintf(&batch, "addr add %s/%d dev %s\n", a, a.BitLen(), other)
	}
	start := time.Now()
	ipBatch(t, batch.String())
	t.Logf("%d addresses bound by ip -batch in %v", bigAddrs, time.Since(start).Round(time.Millisecond))

	// Every address comes back exactly once. The check allocates
	// nothing, so what the walk allocates is measured.
	seen := make(map[netip.Addr]bool, bigAddrs)
	bad := 0
	start = time.Now()
	bytes, objects := measure(func() {
		mustNil(t, n.WalkAddresses(func() { clear(seen) }, func(a netip.Addr) error {
			if !want[a] || seen[a] {
				bad++
			}
			seen[a] = true
			return nil
		}))
	})
	if bad != 0 || len(seen) != bigAddrs {
		t.Fatalf("walked %d of %d addresses; %d wrong or repeated", len(seen), bigAddrs, bad)
	}
	// The memory bound: the walk allocates for the link lookup by name
	// and per request, never per address. A collected slice would cost
	// bigAddrs × sizeof(netip.Addr) (120 kB), the vishvananda/netlink
	// AddrList it replaces several allocations per address of every
	// link. TotalAlloc (every byte allocated, whatever the garbage
	// collector does) stays under a tenth of the slice, the allocations
	// under one per fifty addresses.
	slice := uint64(bigAddrs) * uint64(unsafe.Sizeof(netip.Addr{}))
	t.Logf("walked %d addresses in %v: %d bytes in %d allocations (a collected slice: %d bytes)",
		bigAddrs, time.Since(start).Round(time.Millisecond), bytes, objects, slice)
	if bytes > slice/10 || objects > bigAddrs/50 {
		t.Errorf("the walk allocated %d bytes in %d allocations; want < %d bytes and < %d allocations", bytes, objects, slice/10, bigAddrs/50)
	}

	// The kernel filters by link itself (NETLINK_GET_STRICT_CHK): the
	// dump carries no message about another link, so a node with many
	// addresses elsewhere does not slow the walk.
	idx := linkIndexOf(t, DefaultLinkName)
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	hdr := nl.NewIfAddrmsg(unix.AF_UNSPEC)
	hdr.Index = uint32(idx)
	req.AddData(hdr)
	ours, foreign := 0, 0
	mustNil(t, n.dumps.Dump(req, nil, func(_ uint16, data []byte) error {
		if li, _, _ := parseAddrMsg(data); li == idx {
			ours++
		} else {
			foreign++
		}
		return nil
	}))
	if ours != bigAddrs || foreign != 0 {
		t.Errorf("the kernel sent %d messages about %s and %d about other links; want %d and 0", ours, DefaultLinkName, foreign, bigAddrs)
	}

	// The same dump with every link: LocalAddresses reports the other
	// link's addresses and none of the dummy's.
	local, err := n.LocalAddresses()
	mustNil(t, err)
	for _, a := range otherAddrs {
		if !slices.Contains(local, a) {
			t.Errorf("LocalAddresses misses %v of %s: %v", a, other, local)
		}
	}
	for _, a := range local {
		if want[a] {
			t.Fatalf("LocalAddresses reports %v, bound on %s", a, DefaultLinkName)
		}
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

// TestSandboxWalkAmidWrites: a full pass reads the dummy's addresses
// beside the sync loop, which binds more meanwhile (at start-up, all the
// time). The kernel flags an address dump of every link interrupted by
// any address change between two of its messages — and that is the dump
// a kernel before 4.20 answers the link's walk with (it ignores the
// filter) — so a walk that insists on a consistent dump fails there. The
// walk amid writes completes every time, hands over every address bound
// before it began, and nothing that was never bound: with the link's
// filter (this kernel) and without (an older one, as its dump comes).
func TestSandboxWalkAmidWrites(t *testing.T) {
	const before = 6_000 // far more than one message of the dump
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	var batch strings.Builder
	for i := range before {
		fmt.Fprintf(&batch, "addr add 10.96.%d.%d/32 dev %s\n", i>>8, i&0xff, DefaultLinkName)
	}
	ipBatch(t, batch.String())
	idx := linkIndexOf(t, DefaultLinkName)

	var stop atomic.Bool
	binds := make(chan int)
	go func() {
		i := 0
		for ; !stop.Load() && i < 60_000; i++ {
			if err := n.AddAddress(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})); err != nil {
				t.Errorf("bind: %v", err)
				break
			}
		}
		binds <- i
	}()
	defer func() {
		if !stop.Load() {
			stop.Store(true)
			<-binds
		}
	}()
	// check walks the link's addresses by walk and reports whether every
	// address bound before is there and nothing else but the new binds.
	check := func(what string, walk func(reset func(), fn func(linkIndex int, a netip.Addr) error) error) {
		t.Helper()
		seen := make(map[netip.Addr]bool, before)
		err := walk(func() { clear(seen) }, func(li int, a netip.Addr) error {
			if li != idx {
				return nil // another link's, in the unfiltered dump
			}
			if b := a.As4(); !a.Is4() || b[0] != 10 || b[1] != 96 && b[1] != 99 {
				t.Errorf("%s handed over %v, never bound", what, a)
			}
			seen[a] = true
			return nil
		})
		if err != nil {
			t.Fatalf("%s amid binds: %v", what, err)
		}
		for i := range before {
			if a := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}); !seen[a] {
				t.Fatalf("%s missed %v, bound before it began and never unbound", what, a)
			}
		}
	}
	strictFailed, walks := 0, 0
	for deadline := time.Now().Add(5 * time.Second); walks < 10 || time.Now().Before(deadline); walks++ {
		check("the link's walk", func(reset func(), fn func(int, netip.Addr) error) error {
			return n.WalkAddressesAmidWrites(reset, func(a netip.Addr) error { return fn(idx, a) })
		})
		check("an unfiltered walk amid writes", func(reset func(), fn func(int, netip.Addr) error) error {
			return n.walkAddrs(n.dumps.DumpAmidWrites, 0, reset, fn)
		})
		err := n.walkAddrs(n.dumps.Dump, 0, nil, func(int, netip.Addr) error { return nil })
		if errors.Is(err, ErrDumpInterrupted) {
			strictFailed++
		} else if err != nil {
			t.Fatalf("strict walk: %v", err)
		}
	}
	stop.Store(true)
	nBinds := <-binds
	t.Logf("%d rounds of walks amid %d binds, all complete; %d strict unfiltered walks of the same table failed as interrupted", walks, nBinds, strictFailed)
	if strictFailed == 0 {
		t.Errorf("no strict unfiltered walk was interrupted: the binds did not run during the dumps, and the test tested nothing")
	}
}

// ipBatch runs `ip -batch` with script: a writer independent of the code
// under test, one process for thousands of commands.
func ipBatch(t *testing.T, script string) {
	t.Helper()
	cmd := exec.Command("ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch: %v\n%s", err, out)
	}
}

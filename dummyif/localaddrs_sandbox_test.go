//go:build sandbox

package dummyif

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestSandboxLocalAddressesWhileBinding: the node's addresses are read
// (every 5 s by the node watcher) while the engine binds service
// addresses on the dummy link, as at start-up on a large cluster. A dump
// of every link spans many messages once the dummy holds thousands of
// addresses, and each bind between two of them makes the kernel flag the
// dump as interrupted: five retries later the read failed, every poll
// (found at 100,000 services, where it also read all 100,000 addresses
// each time). Read link by link, the dummy is never read: every read
// succeeds, reports the other links' addresses and none of the dummy's.
func TestSandboxLocalAddressesWhileBinding(t *testing.T) {
	const bound = 8_000 // a dump of every link: far more than one message
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	const other = "localtest0"
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", other).Run() })
	otherAddrs := []netip.Addr{netip.MustParseAddr("10.98.0.1"), netip.MustParseAddr("fd00:98::1")}
	var batch strings.Builder
	fmt.Fprintf(&batch, "link add %s type dummy\n", other)
	for _, a := range otherAddrs {
		fmt.Fprintf(&batch, "addr add %s/%d dev %s\n", a, a.BitLen(), other)
	}
	for i := range bound {
		fmt.Fprintf(&batch, "addr add 10.96.%d.%d/32 dev %s\n", i>>8, i&0xff, DefaultLinkName)
	}
	ipBatch(t, batch.String())

	// The engine's binds, through the code under test, as long as the
	// reads go on.
	var stop atomic.Bool
	binds := make(chan int)
	go func() {
		i := 0
		for ; !stop.Load(); i++ {
			if err := n.AddAddress(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})); err != nil {
				t.Errorf("bind: %v", err)
				break
			}
		}
		binds <- i
	}()
	reads := 0
	deadline := time.Now().Add(5 * time.Second)
	for ; reads < 20 || time.Now().Before(deadline); reads++ {
		local, err := n.LocalAddresses()
		if err != nil {
			stop.Store(true)
			<-binds
			t.Fatalf("read %d while binding: %v", reads, err)
		}
		for _, a := range otherAddrs {
			if !slices.Contains(local, a) {
				t.Errorf("read %d misses %v of %s", reads, a, other)
			}
		}
		for _, a := range local {
			if a.Is4() && a.As4()[0] == 10 && (a.As4()[1] == 96 || a.As4()[1] == 99) {
				t.Fatalf("read %d reports %v, bound on %s", reads, a, DefaultLinkName)
			}
		}
	}
	stop.Store(true)
	nBinds := <-binds
	t.Logf("%d reads of the node's addresses, all complete, during %d binds on a link holding %d addresses", reads, nBinds, bound)
	if nBinds < 100 {
		t.Errorf("only %d binds ran beside the reads: the test did not test reading while binding", nBinds)
	}
}

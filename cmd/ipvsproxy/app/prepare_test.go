package app

import (
	"fmt"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// TestPrepareNodeThenProxyWritesNothing: after prepare-node (the DaemonSet's
// privileged init container), the proxy's own start-up — in a container
// where every sysctl is read-only — finds everything set.
func TestPrepareNodeThenProxyWritesNothing(t *testing.T) {
	sc := sysctl.NewFake(map[string]string{
		"net/ipv4/vs/conntrack": "0", "net/ipv4/vs/expire_nodest_conn": "0",
		"net/ipv4/vs/expire_quiescent_template": "0", "net/ipv4/ip_forward": "0",
		"net/ipv4/conf/all/arp_ignore": "0", "net/ipv4/conf/all/arp_announce": "0",
		"net/netfilter/nf_conntrack_max": "65536", "net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait": "60",
	})
	hashsize := sysctl.NewFake(map[string]string{"hashsize": "16384"})
	o := NewOptions()
	o.StrictARP = true
	if err := prepareNode(o, sc, hashsize, 8); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"net/ipv4/vs/conntrack": "1", "net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2",
		"net/netfilter/nf_conntrack_max": fmt.Sprint(8 * 32768), "net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
	} {
		if got, _ := sc.Get(name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	// The proxy's container: nothing is writable, and nothing needs to be.
	for name := range sc.Values {
		sc.ReadOnly[name] = true
	}
	hashsize.ReadOnly["hashsize"] = true
	if err := prepareNode(o, sc, hashsize, 8); err != nil {
		t.Errorf("second run on a prepared node wanted to write: %v", err)
	}
}

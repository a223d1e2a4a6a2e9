package nodewatch

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestNodePortAddressSelection(t *testing.T) {
	host := addrs("127.0.0.1", "10.0.0.5", "192.168.7.2", "fe80::1", "fd00::5")
	node := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.7.2"}, {Type: v1.NodeExternalIP, Address: "10.0.0.5"}}}}
	cases := []struct {
		flag []string
		want string
	}{
		{nil, "[10.0.0.5 192.168.7.2 fd00::5]"},
		{[]string{"10.0.0.0/8"}, "[10.0.0.5]"},
		{[]string{"primary"}, "[192.168.7.2]"},
		{[]string{"primary", "fd00::/8"}, "[192.168.7.2 fd00::5]"},
		{[]string{"all"}, "[10.0.0.5 192.168.7.2 fd00::5]"},
		{[]string{"primary", "all"}, "[10.0.0.5 192.168.7.2 fd00::5]"},
		{[]string{"localhost", "10.0.0.0/8"}, "[10.0.0.5]"},
		{[]string{"127.0.0.0/8"}, "[]"},
	}
	for _, c := range cases {
		f, err := ParseNodePortAddresses(c.flag)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(f.Pick(host, node)); got != c.want {
			t.Errorf("--nodeport-addresses %v: %s, want %s", c.flag, got, c.want)
		}
	}
	// "primary" on a Node without an InternalIP: the node IP found at
	// start (here from the default route); none found means none.
	noInternal := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeHostName, Address: "node-a"}}}}
	for _, c := range []struct {
		node   *v1.Node
		nodeIP netip.Addr
		want   string
	}{
		{noInternal, netip.MustParseAddr("10.0.0.5"), "[10.0.0.5]"},
		{nil, netip.MustParseAddr("192.168.7.2"), "[192.168.7.2]"},
		{node, netip.MustParseAddr("10.0.0.5"), "[192.168.7.2]"}, // the InternalIP wins
		{noInternal, netip.Addr{}, "[]"},
	} {
		primary := NodePortFilter{primary: true, NodeIP: c.nodeIP}
		if got := fmt.Sprint(primary.Pick(host, c.node)); got != c.want {
			t.Errorf("primary, node IP %v: %s, want %s", c.nodeIP, got, c.want)
		}
	}
	if _, err := ParseNodePortAddresses([]string{"eth0"}); err == nil || err.Error() != `--nodeport-addresses: "eth0" is neither a CIDR nor one of primary, all, localhost` {
		t.Errorf("bad --nodeport-addresses: %v", err)
	}
}

// Loopback node ports are asked for and not served: one warning names
// what was asked; nothing else warns.
func TestNodePortLoopbackWarning(t *testing.T) {
	for _, c := range []struct {
		flag []string
		want string
	}{
		{[]string{"primary", "all"}, ""},
		{[]string{"localhost", "primary", "::1/128"}, "--nodeport-addresses localhost,::1/128: node ports are not served on loopback addresses with IPVS; ignored"},
	} {
		f, err := ParseNodePortAddresses(c.flag)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Warning(); got != c.want {
			t.Errorf("%v: warning %q, want %q", c.flag, got, c.want)
		}
	}
}

// TestNodeWatcherPublishesOnlyChanges: the runner is told about the node
// once per real change (each makes it sync the services it affects).
func TestNodeWatcherPublishesOnlyChanges(t *testing.T) {
	d := dummyif.NewFake("")
	d.SetLocalAddresses(addrs("10.0.0.5", "127.0.0.1")...)
	var got []sync.NodeFacts
	w := New(d, NodePortFilter{}, func(f sync.NodeFacts) { got = append(got, f) })
	refresh := func() {
		if err := w.Refresh(); err != nil {
			t.Fatal(err)
		}
	}
	refresh()
	refresh()
	if len(got) != 1 || fmt.Sprint(got[0].NodePortAddresses) != "[10.0.0.5]" || fmt.Sprint(got[0].HostAddresses) != "[10.0.0.5 127.0.0.1]" {
		t.Fatalf("first refresh: %+v", got)
	}
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{sync.LabelZone: "zone-a"}}}
	w.Handler().OnAdd(n, true)
	if len(got) != 2 || got[1].Zone != "zone-a" {
		t.Fatalf("zone label: %+v", got)
	}
	// A pod's veth comes with its own link-local addresses: not a node change.
	d.SetLocalAddresses(addrs("10.0.0.5", "127.0.0.1", "fe80::1c2b:3ff:fe4d:5e6f", "169.254.1.1")...)
	refresh()
	if len(got) != 2 {
		t.Fatalf("link-local addresses of a pod veth published a node change: %+v", got[2:])
	}
	d.SetLocalAddresses(addrs("10.0.0.5", "10.0.0.6", "127.0.0.1")...)
	refresh()
	if len(got) != 3 || fmt.Sprint(got[2].NodePortAddresses) != "[10.0.0.5 10.0.0.6]" {
		t.Fatalf("new address: %+v", got)
	}
	if !w.Eligible() {
		t.Error("a live node is eligible")
	}
	dying := n.DeepCopy()
	dying.Spec.Taints = []v1.Taint{{Key: TaintToBeDeleted, Effect: v1.TaintEffectNoSchedule}}
	w.Handler().OnUpdate(n, dying)
	if w.Eligible() {
		t.Error("a node tainted ToBeDeletedByClusterAutoscaler must not be eligible")
	}
	deleting := n.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	w.Handler().OnUpdate(dying, deleting)
	if w.Eligible() {
		t.Error("a node being deleted must not be eligible")
	}
}

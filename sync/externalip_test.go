package sync

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestExternalIPsTrustedAsKubeProxy pins what docs/security.md ("External
// IPs") tells operators, CVE-2020-8554's class: a Service's externalIPs are
// programmed whatever address they name — the node's own IP (its port
// taken over, the address not bound again) or a pod's IP (bound on
// kube-ipvs0, so the node's connections to it reach the Service's pods) —
// and only what is not global unicast is refused, with a Warning.
func TestExternalIPsTrustedAsKubeProxy(t *testing.T) {
	s := svc("tenant", "mitm", "10.96.0.70", "22")
	s.Spec.ExternalIPs = []string{"192.168.0.2", "10.244.7.7", "169.254.169.254"}
	k, b := program(t, nodeConfig(), s,
		slice("tenant", "mitm", "a", "", 2222, v1.ProtocolTCP, ep{ip: "10.244.9.1", node: testNode}))
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.70:22 -s rr
-a -t 10.96.0.70:22 -r 10.244.9.1:2222 -m -w 1
-A -t 10.244.7.7:22 -s rr
-a -t 10.244.7.7:22 -r 10.244.9.1:2222 -m -w 1
-A -t 192.168.0.2:22 -s rr
-a -t 192.168.0.2:22 -r 10.244.9.1:2222 -m -w 1
`)
	got := k.Dummy.Addresses()
	if !slices.Contains(got, netip.MustParseAddr("10.244.7.7")) || slices.Contains(got, netip.MustParseAddr("192.168.0.2")) {
		t.Errorf("kube-ipvs0 holds %v: want the pod IP bound, the node's own IP not", got)
	}
	if len(b.Problems) != 1 || b.Problems[0] != `externalIP "169.254.169.254" is not a unicast IP address` {
		t.Errorf("problems %q: want the link-local address refused", b.Problems)
	}
}

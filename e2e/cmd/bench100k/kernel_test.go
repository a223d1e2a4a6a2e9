//go:build e2e

package main

import (
	"bufio"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
)

// procText writes what /proc/net/ip_vs shows for a programmed workload,
// the critical services last; edit changes one real-server line
// (service i, endpoint j) or drops it (returns "").
func procText(w *workload, edit func(i, j int, line string) string) string {
	var b strings.Builder
	b.WriteString("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n")
	reals := func(i int) {
		for j := 0; j < endpointsPer; j++ {
			line := fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0         \n", w.endpointAddr(i, j), targetPort)
			if edit != nil {
				line = edit(i, j, line)
			}
			b.WriteString(line)
		}
	}
	for i := 0; i < w.n; i++ {
		fmt.Fprintf(&b, "TCP  %08X:%04X rr \n", clusterIP(i), servicePort)
		reals(i)
		if np := nodePort(i); np != 0 {
			fmt.Fprintf(&b, "TCP  %08X:%04X rr \n", addrV(w.nodeIP), np)
			reals(i)
		}
	}
	return b.String() + critText(nil)
}

// critText is the critical services' part of /proc/net/ip_vs; edit
// changes or drops ("") a line of virtual server v (real server j, or
// the virtual server's own line at j = -1).
func critText(edit func(v critVS, j int, line string) string) string {
	var b strings.Builder
	for _, v := range criticalVirtualServers() {
		proto := map[uint16]string{syscall.IPPROTO_TCP: "TCP", syscall.IPPROTO_UDP: "UDP"}[v.proto]
		lines := []string{fmt.Sprintf("%s  %08X:%04X rr \n", proto, v.ip, v.port)}
		for _, r := range v.reals {
			lines = append(lines, fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0\n", r, v.target))
		}
		for j, line := range lines {
			if edit != nil {
				line = edit(v, j-1, line)
			}
			b.WriteString(line)
		}
	}
	return b.String()
}

func check(t *testing.T, w *workload, text string) ipvsCheck {
	t.Helper()
	c, err := w.checkIPVSText(bufio.NewReader(strings.NewReader(text)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheckIPVS(t *testing.T) {
	w, err := newWorkload(120, 5, 1, "n", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if w.nodePorts != 2 {
		t.Fatalf("%d node ports, want 2 (services 49 and 99)", w.nodePorts)
	}
	// 120 ClusterIPs, 2 node ports, and the critical services' 4 virtual
	// servers: kubernetes (3 API servers), DNS on 53/UDP, 53/TCP and
	// 9153/TCP (2 pods each).
	c := check(t, w, procText(w, nil))
	if !c.done() || c.Want != 126 || c.VS != 126 || c.Reals != 1229 || c.Foreign != 0 || c.WrongReal != 0 {
		t.Fatalf("complete kernel: %v", c)
	}
	if w.wantVS() != 126 || w.wantReals() != 1229 || w.wantAddrs() != 122 {
		t.Errorf("want %d VS, %d real servers, %d addresses", w.wantVS(), w.wantReals(), w.wantAddrs())
	}
	sampled := w.sample[0]
	cases := map[string]struct {
		edit               func(i, j int, line string) string
		extra              string
		complete, wrong, f int
	}{
		"a real server missing": {edit: func(i, j int, l string) string {
			if i == 7 && j == 3 {
				return ""
			}
			return l
		}, complete: 125},
		"a real server at weight 0": {edit: func(i, j int, l string) string {
			if i == 99 && j == 0 {
				return strings.Replace(l, "Masq    1", "Masq    0", 1)
			}
			return l
		}, complete: 124, wrong: 2}, // the ClusterIP and the node port
		"another service's endpoint": {edit: func(i, j int, l string) string {
			if i == 8 && j == 9 {
				return fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0\n", w.endpointAddr(9, 0), targetPort)
			}
			return l
		}, complete: 125, wrong: 1},
		"a pod endpoint on the wrong port": {edit: func(i, j int, l string) string {
			if i == sampled && j == 1 {
				return fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0\n", w.endpointAddr(i, j), 9999)
			}
			return l
		}, complete: 125, wrong: 1},
		"a foreign virtual server": {extra: "TCP  C0000210:0050 wlc \n  -> 0A800001:1F90      Masq    3      0          0\nUDP  0A600001:0035 rr \n", complete: 126, f: 2},
	}
	for name, tc := range cases {
		c := check(t, w, procText(w, tc.edit)+tc.extra)
		if c.Complete != tc.complete || c.WrongReal != tc.wrong || c.Foreign != tc.f {
			t.Errorf("%s: %v; want %d complete, %d wrong, %d foreign", name, c, tc.complete, tc.wrong, tc.f)
		}
	}
}

// TestCheckIPVSCritical: a critical virtual server counts as complete
// only with exactly its endpoints at the target port; an address of it
// on another protocol is foreign.
func TestCheckIPVSCritical(t *testing.T) {
	w, err := newWorkload(120, 5, 1, "n", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	generated := strings.TrimSuffix(procText(w, nil), critText(nil))
	isDNS := func(v critVS, proto uint16, port int) bool {
		return v.service == "kube-system/kube-dns" && v.proto == proto && v.port == port
	}
	cases := map[string]struct {
		edit                         func(v critVS, j int, line string) string
		extra                        string
		vs, complete, wrong, foreign int
	}{
		"complete": {vs: 126, complete: 126},
		"an API server missing": {edit: func(v critVS, j int, l string) string {
			if v.service == "default/kubernetes" && j == 2 {
				return ""
			}
			return l
		}, vs: 126, complete: 125},
		"DNS over UDP not there at all": {edit: func(v critVS, _ int, l string) string {
			if isDNS(v, syscall.IPPROTO_UDP, 53) {
				return ""
			}
			return l
		}, vs: 125, complete: 125},
		"a DNS pod at weight 0": {edit: func(v critVS, j int, l string) string {
			if isDNS(v, syscall.IPPROTO_TCP, 9153) && j == 1 {
				return strings.Replace(l, "Masq    1", "Masq    0", 1)
			}
			return l
		}, vs: 126, complete: 125, wrong: 1},
		"an API server on the service's port": {edit: func(v critVS, j int, l string) string {
			if v.service == "default/kubernetes" && j == 0 {
				return fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0\n", v.reals[0], 443)
			}
			return l
		}, vs: 126, complete: 125, wrong: 1},
		"the kubernetes VIP over UDP": {extra: "UDP  6FFF0001:01BB rr \n", vs: 127, complete: 126, foreign: 1},
	}
	for name, tc := range cases {
		c := check(t, w, generated+critText(tc.edit)+tc.extra)
		if c.VS != tc.vs || c.Complete != tc.complete || c.WrongReal != tc.wrong || c.Foreign != tc.foreign {
			t.Errorf("%s: %v; want %d virtual servers, %d complete, %d wrong, %d foreign", name, c, tc.vs, tc.complete, tc.wrong, tc.foreign)
		}
	}
}

// TestCriticalAddresses: the critical ClusterIPs are in the service range
// but past every generated one, their endpoints in the routed criticalNet
// and in no generated service's plan.
func TestCriticalAddresses(t *testing.T) {
	w, err := newWorkload(maxServices, 50, 9, "n", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	services, routed := netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix(criticalNet)
	for _, v := range criticalVirtualServers() {
		if a := vAddr(v.ip); !services.Contains(a) || v.ip <= clusterIP(maxServices-1) {
			t.Errorf("%v: ClusterIP outside the range or among the generated ones (the last is %v)", v, vAddr(clusterIP(maxServices-1)))
		}
		for _, r := range v.reals {
			if _, ok := w.serviceOfEndpoint(r); ok || !routed.Contains(vAddr(r)) {
				t.Errorf("%v: endpoint %v is a generated service's or not in %s", v, vAddr(r), criticalNet)
			}
		}
	}
	if len(criticalVirtualServers()) != 4 || criticalReals() != 3+3*2 {
		t.Errorf("%d critical virtual servers with %d real servers, want 4 with 9", len(criticalVirtualServers()), criticalReals())
	}
}

// TestCriticalComplete: the per-VIP poll's verdict on one virtual
// server's real servers as netlink returns them.
func TestCriticalComplete(t *testing.T) {
	v := criticalVirtualServers()[0] // kubernetes: 3 API servers at 6443
	all := []realServer{{v.reals[2], 6443, 1}, {v.reals[0], 6443, 1}, {v.reals[1], 6443, 1}}
	if !v.complete(all) {
		t.Error("every API server, in another order: not complete")
	}
	for name, rs := range map[string][]realServer{
		"none":            nil,
		"two of three":    all[:2],
		"one draining":    {all[0], all[1], {v.reals[1], 6443, 0}},
		"a wrong port":    {all[0], all[1], {v.reals[1], 443, 1}},
		"one extra":       append(append([]realServer{}, all...), realServer{addrV(netip.MustParseAddr("10.127.255.9")), 6443, 1}),
		"another address": {all[0], all[1], {addrV(netip.MustParseAddr("10.127.255.11")), 6443, 1}},
	} {
		if v.complete(rs) {
			t.Errorf("%s: complete", name)
		}
	}
}

func TestAddressPlan(t *testing.T) {
	w, err := newWorkload(maxServices, 50, 9, "n", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newWorkload(maxServices+1, 50, 9, "n", netip.MustParseAddr("10.10.0.1")); err == nil {
		t.Error("a workload past the address plan was accepted")
	}
	for _, i := range []int{0, 1, 253, 254, w.sample[0], maxServices - 1} {
		for j := 0; j < endpointsPer; j++ {
			v := w.endpointAddr(i, j)
			if b := v & 255; b == 0 || b == 255 {
				t.Fatalf("endpoint %d/%d is %v: a .0 or .255", i, j, vAddr(v))
			}
			if got, ok := w.serviceOfEndpoint(v); !ok || got != i {
				t.Fatalf("endpoint %d/%d (%v) maps back to %d %v", i, j, vAddr(v), got, ok)
			}
		}
	}
	if last := vAddr(w.endpointAddr(maxServices-1, endpointsPer-1)); !netip.MustParsePrefix("10.128.0.0/12").Contains(last) {
		t.Errorf("last endpoint %v is outside the routed /12", last)
	}
	if _, ok := w.serviceOfEndpoint(addrV(netip.MustParseAddr("10.144.0.1"))); ok {
		t.Error("an address outside the plan maps to a service")
	}
}

func TestParseSets(t *testing.T) {
	out := `Name: KUBE-CLUSTER-IP
Type: hash:ip,port
Revision: 6
Header: family inet hashsize 65536 maxelem 262144 bucketsize 12 initval 0x1
Size in memory: 5000
References: 2
Number of entries: 120

Name: KUBE-NODE-PORT-TCP
Type: bitmap:port
Revision: 3
Header: range 0-65535
Size in memory: 8264
References: 1
Number of entries: 2

Name: KUBE-EXTERNAL-IP
Type: hash:ip,port
Revision: 6
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x2
Size in memory: 200
References: 0
Number of entries: 1
`
	w, _ := newWorkload(120, 5, 1, "n", netip.MustParseAddr("10.10.0.1"))
	sets := parseSets(out)
	if len(sets) != 3 || sets[0].Entries != 120 || sets[1].Type != "bitmap:port" || !strings.Contains(sets[0].Header, "maxelem 262144") {
		t.Fatalf("parsed %+v", sets)
	}
	ok, missing := w.setsComplete(sets)
	// KUBE-EXTERNAL-IP must be empty; KUBE-IPVS-IPS and KUBE-LOOP-BACK are
	// missing; KUBE-CLUSTER-IP holds the critical services' 4 ports too.
	if ok || len(missing) != 2 || sets[2].Expected != 0 || sets[0].Expected != 124 {
		t.Errorf("ok %v, missing %v, sets %+v", ok, missing, sets)
	}
}
